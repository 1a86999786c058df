"""How this host's GPUs are joined: NVLink or only PCIe, read from NVML, recordable as JSON.

Tensor parallelism all-reduces activations twice per layer per step; over PCIe (tens of GB/s)
instead of NVLink (hundreds) that traffic can cost more than the extra GPU saves. The planner
reads the links for each pair of GPUs once; a recorded topology (the same JSON) stands in for
NVML in tests and for planning another host.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmconsole.engine import nvml

# nvmlGpuTopologyLevel_t, named as `nvidia-smi topo -m` prints them.
_LEVELS = {0: "SELF", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_P2P_CAPS_INDEX_NVLINK = 3  # NVML_P2P_CAPS_INDEX_NVLINK
_P2P_STATUS_OK = 0


@dataclass(frozen=True)
class GpuLink:
    a: int
    b: int
    nvlink: bool
    path: str  # PCIe path when not NVLink: PIX, PXB, PHB, NODE, SYS (or N/A)


@dataclass(frozen=True)
class Topology:
    gpu_names: tuple[str, ...]
    links: tuple[GpuLink, ...]
    source: str

    @property
    def num_gpus(self) -> int:
        return len(self.gpu_names)

    def pcie_only_pairs(self, gpus: tuple[int, ...] | None = None) -> list[GpuLink]:
        chosen = set(range(self.num_gpus) if gpus is None else gpus)
        return [link for link in self.links if not link.nvlink and link.a in chosen and link.b in chosen]

    def nvlink_group(self, size: int) -> tuple[int, ...] | None:
        """`size` GPUs every pair of which is NVLink-joined, if the host has such a group."""
        joined = {(link.a, link.b) for link in self.links if link.nvlink}
        for group in itertools.combinations(range(self.num_gpus), size):
            if all(pair in joined for pair in itertools.combinations(group, 2)):
                return group
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": [{"index": i, "name": n} for i, n in enumerate(self.gpu_names)],
            "links": [{"a": link.a, "b": link.b, "nvlink": link.nvlink, "path": link.path} for link in self.links],
            "source": self.source,
        }


def topology_from_json(data: dict[str, Any], source: str = "recorded") -> Topology:
    names = tuple(g["name"] for g in sorted(data["gpus"], key=lambda g: g["index"]))
    links = tuple(
        GpuLink(int(link["a"]), int(link["b"]), bool(link["nvlink"]), str(link.get("path", "N/A")))
        for link in data["links"]
    )
    return Topology(names, links, data.get("source", source))


def load_topology(path: Path) -> Topology:
    return topology_from_json(json.loads(Path(path).read_text()), source=str(path))


def read_topology() -> Topology | None:
    """This host's GPUs and links from NVML; None where NVML or GPUs are absent."""
    nv = nvml.NVML
    count = nv.call("nvmlDeviceGetCount")  # None where NVML is absent: no GPUs to plan for
    if not count:
        return None
    handles = [nv.call("nvmlDeviceGetHandleByIndex", i) for i in range(count)]
    names = [nv.name_text(h) or "N/A" for h in handles]
    links = []
    for a, b in itertools.combinations(range(count), 2):
        ha, hb = handles[a], handles[b]
        p2p = nv.call("nvmlDeviceGetP2PStatus", ha, hb, _P2P_CAPS_INDEX_NVLINK)
        level = nv.call("nvmlDeviceGetTopologyCommonAncestor", ha, hb)
        path = _LEVELS.get(level, "N/A") if level is not None else "N/A"
        links.append(GpuLink(a, b, p2p == _P2P_STATUS_OK, path))
    return Topology(tuple(names), tuple(links), "NVML")
