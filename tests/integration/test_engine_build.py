"""The engine as shipped: backends loaded from the wheel, a dispatch variant chosen, refused
weight layouts really refused, the capture library built once, the offload plan applied."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_VARIANTS = {
    "x64",
    "sse42",
    "sandybridge",
    "haswell",
    "skylakex",
    "icelake",
    "zen4",
    "alderlake",
}

# Loads a model in a fresh process (the refusal acts before the first load of a process)
# and prints what the backend report and llama.cpp's own load lines say.
PROBE = r"""
import json, logging, sys
lines = []
class Keep(logging.Handler):
    def emit(self, record): lines.append(record.getMessage())
logging.getLogger().addHandler(Keep()); logging.getLogger().setLevel(logging.DEBUG)
from core.llama_engine import EngineConfig, LlamaStageEngine
from core.models import resolve_model
config = EngineConfig(n_ctx=128, n_batch=16, n_seq_max=1)
engine = LlamaStageEngine(resolve_model("gemma-3-270m"), config)
r = engine.backend
print(json.dumps({
    "variant": r.cpu_variant, "dynamic": r.dynamic, "disabled": list(r.disabled_buffer_types),
    "devices": [d.name for d in r.devices], "gpu_layers": engine.offload.n_gpu_layers,
    "buffers": [ln for ln in lines if "model buffer size" in ln],
}))
engine.close()
"""


def _probe(**env: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_shipped_build_loads_a_dispatch_variant_and_no_amx() -> None:
    got = _probe()
    assert got["dynamic"] is True, "the wheel should be the GGML_BACKEND_DL build"
    assert got["variant"] in SHIPPED_VARIANTS
    assert "CPU" in got["devices"]  # type: ignore[operator]
    assert not any("AMX" in b for b in got["buffers"])  # type: ignore[attr-defined]
    from core.backends import LIB_DIR

    modules = {p.name for p in LIB_DIR.glob("*ggml-cpu-*")}
    assert modules, "CPU variant modules missing from the installed wheel"
    assert not any("sapphirerapids" in m for m in modules), "the AMX variant must not ship"


def test_refused_layouts_are_never_used_for_weights() -> None:
    # No AMX here; refusing the repacked layout proves the same mechanism on any CPU.
    default = _probe()
    refused = _probe(SANGAMA_REFUSE_BUFFER_TYPES="CPU_REPACK")
    assert any("CPU_REPACK" in b for b in default["buffers"])  # type: ignore[attr-defined]
    assert refused["disabled"] == ["CPU_REPACK"]
    assert not any("CPU_REPACK" in b for b in refused["buffers"])  # type: ignore[attr-defined]


def test_cpu_only_machine_plans_no_offload() -> None:
    got = _probe(SANGAMA_DEVICE="cpu")
    assert got["gpu_layers"] == 0


def test_capture_library_is_built_once_by_concurrent_processes(tmp_path: Path) -> None:
    script = (
        "import sys; from pathlib import Path; from core.capture_lib import build_capture_lib;"
        "print(build_capture_lib(Path(sys.argv[1])))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    paths = {p.communicate(timeout=180)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(paths) == 1, "every process names the same library"
    built = sorted(x.name for x in tmp_path.iterdir() if x.suffix in (".so", ".dll"))
    assert len(built) == 1
    assert not list(tmp_path.glob("*.tmp")), "no temporary file left behind"
    # The name is a digest of the source: stable across processes (unlike hash()).
    again = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert again in paths
