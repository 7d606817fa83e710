"""The tools bundle (pd_operator.serving_image.bundle): what `pd-bundle` lays out is self-contained,
imports nothing a vllm-ascend serving image lacks, and runs there.

The static check reads every import statement of every bundled module (lazy ones too); the run
starts both launchers with this venv's interpreter under `-S` (no site-packages, so not the editable
pd_operator) and a PYTHONPATH of exactly the serving image's packages (support.image_model), as the
images tier does in the stock-serving stand-in image.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from pd_operator.serving_image import bundle
from pd_operator.serving_image.contents import release_contents
from support import image_model

ROOT = Path(__file__).resolve().parents[2]


def test_the_bundle_imports_only_the_stdlib_and_what_a_serving_image_has():
    modules = bundle.closure()
    assert set(bundle.ENTRY_POINTS.values()) <= set(modules)
    assert bundle.outside_the_serving_image(modules) == {}
    assert set(bundle.foreign_imports(modules)) & bundle.SERVING_MODULES == bundle.SERVING_MODULES


def test_the_static_check_sees_a_lazy_import_of_another_package(tmp_path):
    """A module importing what the image lacks, even inside a function, is reported with its user."""
    pkg = tmp_path / "pd_operator"
    (pkg / "preflight").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "preflight" / "__init__.py").write_text("")
    (pkg / "preflight" / "cli.py").write_text("import json\n\ndef main():\n    import jsonschema\n")
    modules = bundle.closure(["pd_operator.preflight.cli"], root=pkg)
    assert bundle.outside_the_serving_image(modules) == {"jsonschema": {"pd_operator.preflight.cli"}}


def test_pd_bundle_is_a_console_script_of_the_package():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[bundle.COMMAND] == "pd_operator.serving_image.bundle:main"
    assert set(bundle.ENTRY_POINTS) <= set(scripts)
    for name, module in bundle.ENTRY_POINTS.items():
        assert scripts[name] == f"{module}:main"


def test_pd_bundle_writes_the_launchers_and_the_package_data(tmp_path):
    done = subprocess.run([Path(sys.executable).with_name(bundle.COMMAND), str(tmp_path / "tools")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    tools = tmp_path / "tools"
    assert {p.name for p in tools.iterdir()} == {*bundle.ENTRY_POINTS, "pd_operator"}
    assert list((tools / "pd_operator" / "kv" / "presets").glob("*.yaml"))
    assert not (tools / "pd_operator" / "controller").exists()  # the operator's own code stays out
    again = subprocess.run([Path(sys.executable).with_name(bundle.COMMAND), str(tools)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr  # an init container that restarts finds an old copy


def test_pd_bundle_reports_an_unwritable_destination(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = subprocess.run([Path(sys.executable).with_name(bundle.COMMAND), str(blocker / "tools")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "cannot write the bundle" in done.stderr
    assert "Traceback" not in done.stderr


def test_both_launchers_run_with_only_a_serving_images_packages(tmp_path):
    tools = tmp_path / "tools"
    bundle.write(tools)
    bin_dir, site = image_model.lay_out(release_contents("0.30.0rc2"), tmp_path / "image")
    env = image_model.path_env(bin_dir, site)
    for name in bundle.ENTRY_POINTS:
        done = subprocess.run([bin_dir / "python3", tools / name, "--help"], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"usage: {name}")
    # Nothing else would have found pd_operator: without the bundle's directory first on the path, the
    # same interpreter fails.
    done = subprocess.run([bin_dir / "python3", "-c", "import pd_operator"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and "No module named 'pd_operator'" in done.stderr
