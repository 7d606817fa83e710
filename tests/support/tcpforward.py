"""A TCP forwarder: `python -m support.tcpforward LISTEN_IP:PORT TARGET_HOST:PORT`.

The real node's stand-in for kube-proxy for one Service, the `kubernetes` one (support/node.py): a pod
reaches kube-apiserver at that Service's ClusterIP and port 443, which this forwards to the API
server's loopback port. Standard library only.
"""

from __future__ import annotations

import asyncio
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def main(listen: str, target: str) -> None:
    host, port = listen.rsplit(":", 1)
    to_host, to_port = target.rsplit(":", 1)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(to_host, int(to_port))
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, host, int(port))
    print(f"tcpforward: {listen} -> {target}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
