package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// npuPlugin advertises `count` healthy devices of one extended resource (huawei.com/Ascend910, ...)
// through the kubelet's device plugin API (k8s.io/kubelet: pkg/apis/deviceplugin/v1beta1 @ v0.36.3):
// the real node's stand-in for Ascend's device plugin, so the kubelet admits and accounts NPU pods as
// on an NPU node. Allocate hands a container the devices' ids in ASCEND_VISIBLE_DEVICES, the variable
// Ascend's plugin sets; there is no device file to mount.
type npuPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	resource string
	count    int
}

func (p *npuPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *npuPlugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	devices := make([]*pluginapi.Device, p.count)
	for i := range devices {
		devices[i] = &pluginapi.Device{ID: strconv.Itoa(i), Health: pluginapi.Healthy}
	}
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
		return err
	}
	<-stream.Context().Done() // the devices never change
	return nil
}

func (p *npuPlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	out := &pluginapi.AllocateResponse{}
	for _, container := range req.ContainerRequests {
		out.ContainerResponses = append(out.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"ASCEND_VISIBLE_DEVICES": strings.Join(container.DevicesIds, ",")}})
	}
	return out, nil
}

// serve listens on DIR/<endpoint> and registers the resource with the kubelet's socket in DIR.
func (p *npuPlugin) serve(dir string) (*grpc.Server, error) {
	endpoint := "pd-npu-" + strings.NewReplacer("/", "-", ".", "-").Replace(p.resource) + ".sock"
	socket := filepath.Join(dir, endpoint)
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	go func() { _ = server.Serve(listener) }()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket)),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		server.Stop()
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: p.resource})
	if err != nil {
		server.Stop()
		return nil, fmt.Errorf("register %s: %w", p.resource, err)
	}
	return server, nil
}

func inode(path string) uint64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Ino
}

// runNPUDevicePlugin: `testcluster npu-device-plugin --dir DIR RESOURCE=COUNT...`. It registers once
// the kubelet's socket exists and again whenever the kubelet restarts (a new socket), as device
// plugins must.
func runNPUDevicePlugin() {
	flags := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	dir := flags.String("dir", filepath.Dir(pluginapi.KubeletSocket), "the kubelet's device-plugins directory")
	_ = flags.Parse(os.Args[1:])
	var plugins []*npuPlugin
	for _, arg := range flags.Args() {
		name, count, ok := strings.Cut(arg, "=")
		n, err := strconv.Atoi(count)
		if !ok || err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "npu-device-plugin: want RESOURCE=COUNT, got %q\n", arg)
			os.Exit(2)
		}
		plugins = append(plugins, &npuPlugin{resource: name, count: n})
	}
	kubeletSocket := filepath.Join(*dir, filepath.Base(pluginapi.KubeletSocket))
	var registered uint64
	var servers []*grpc.Server
	for ; ; time.Sleep(200 * time.Millisecond) {
		current := inode(kubeletSocket)
		if current == 0 || current == registered {
			continue
		}
		for _, s := range servers {
			s.Stop()
		}
		servers = nil
		failed := false
		for _, p := range plugins {
			server, err := p.serve(*dir)
			if err != nil {
				fmt.Fprintf(os.Stderr, "npu-device-plugin: %v (retrying)\n", err)
				failed = true
				break
			}
			servers = append(servers, server)
			fmt.Printf("npu-device-plugin: registered %s: %d devices\n", p.resource, p.count)
		}
		if !failed {
			registered = current
		}
	}
}
