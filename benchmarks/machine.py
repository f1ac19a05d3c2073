"""The machine line every benchmark prints beside its figures: CPU model, cores, memory, whether the
CPU has native bf16 (it decides `dtype=auto`), and the load average (other work shares the cores)."""

from __future__ import annotations

import os
from pathlib import Path


def _proc(name: str) -> str:
    try:
        return Path("/proc", name).read_text()
    except OSError:
        return ""


def describe() -> str:
    cpuinfo = _proc("cpuinfo").splitlines()
    cpu = next((x.split(":", 1)[1].strip() for x in cpuinfo if x.startswith("model name")), "unknown CPU")
    flags = next((x.split(":", 1)[1].split() for x in cpuinfo if x.startswith("flags")), [])
    bf16 = next((f for f in ("avx512_bf16", "amx_bf16") if f in flags), "no native bf16")
    mem = next((int(x.split()[1]) / 2**20 for x in _proc("meminfo").splitlines() if x.startswith("MemTotal")), float("nan"))
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (f"{os.cpu_count()} cores of {cpu} ({bf16}), {mem:.0f} GiB; "
            f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min)")
