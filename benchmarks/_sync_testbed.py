"""Emulated two-cluster network for the weight sync benchmark (Linux network namespaces + tc).

Layout, one namespace per rank so no two ranks can talk over loopback (which tc cannot shape):

    t0 ... tN-1 --eth0/pK--> [c0: bridge br0] --x0 ====shaped==== x1--> [c1: bridge br1] <--pK/eth0-- r0 ... rR-1

* every rank's ``eth0`` and its bridge port ``pK`` carry a tbf at the intra-cluster rate (both directions);
* the single cross link ``x0``/``x1`` carries a tbf at the cross-cluster rate in each direction;
* jumbo frames (MTU 9000) keep header overhead below 1% so the cut counters read close to payload bytes.

Bandwidth-only emulation: there is no netem here, so no added latency.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field

SUBNET = "10.77"
MTU = 9000
PORT = 29517


def sh(*args: str, check: bool = True) -> str:
    """Run a command, return stdout; raise with stderr on failure."""
    p = subprocess.run(args, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def tbf(ns: str, dev: str, mbit: float) -> None:
    """Shape ``dev`` egress in ``ns`` with a token bucket; burst >= 1% of a second and >= 256 KiB."""
    rate_bps = mbit * 1e6 / 8
    burst = max(256 * 1024, int(rate_bps / 100))
    sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
       "rate", f"{mbit}mbit", "burst", str(burst), "latency", "100ms")  # fmt: skip


@dataclass(slots=True, kw_only=True)
class Testbed:
    """Namespaces, bridges and shaped links for ``n_trainers`` + ``n_rollouts`` ranks."""

    prefix: str
    """Unique name prefix (``rmxs<pid>``), at most 8 characters so interface names fit in 15."""
    n_trainers: int
    """Ranks 0 .. N_T-1 live in cluster 0."""
    n_rollouts: int
    """Ranks N_T .. N_T+R-1 live in cluster 1."""
    cross_mbit: float
    """Cross-cluster rate, each direction."""
    intra_mbit: float
    """Per-rank injection rate inside a cluster, each direction."""
    created: list[str] = field(default_factory=list)
    """Namespaces created so far (what ``down`` deletes)."""

    def ns(self, name: str) -> str:
        """Full namespace name."""
        return f"{self.prefix}-{name}"

    def rank_ns(self, rank: int) -> str:
        """Namespace of a global rank."""
        return self.ns(f"t{rank}" if rank < self.n_trainers else f"r{rank - self.n_trainers}")

    @staticmethod
    def addr(rank: int) -> str:
        """IPv4 address of a rank's ``eth0``."""
        return f"{SUBNET}.{rank // 250}.{rank % 250 + 1}"

    def up(self) -> None:
        """Create everything; on error the caller still calls ``down``."""
        for c in (0, 1):
            self._add_ns(self.ns(f"c{c}"))
            sh("ip", "-n", self.ns(f"c{c}"), "link", "add", f"br{c}", "type", "bridge")
        self._veth(f"{self.prefix}x0", self.ns("c0"), "x0", f"{self.prefix}x1", self.ns("c1"), "x1")
        for c in (0, 1):
            for dev in (f"x{c}", f"br{c}"):
                sh("ip", "-n", self.ns(f"c{c}"), "link", "set", dev, "mtu", str(MTU), "up")
            sh("ip", "-n", self.ns(f"c{c}"), "link", "set", f"x{c}", "master", f"br{c}")
            tbf(self.ns(f"c{c}"), f"x{c}", self.cross_mbit)
        for rank in range(self.n_trainers + self.n_rollouts):
            self._rank(rank)

    def _rank(self, rank: int) -> None:
        ns, c = self.rank_ns(rank), 0 if rank < self.n_trainers else 1
        cns = self.ns(f"c{c}")
        self._add_ns(ns)
        self._veth(f"{self.prefix}a{rank}", ns, "eth0", f"{self.prefix}b{rank}", cns, f"p{rank}")
        sh("ip", "-n", ns, "addr", "add", f"{self.addr(rank)}/16", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "set", "eth0", "mtu", str(MTU), "up")
        sh("ip", "-n", cns, "link", "set", f"p{rank}", "mtu", str(MTU), "master", f"br{c}", "up")
        tbf(ns, "eth0", self.intra_mbit)
        tbf(cns, f"p{rank}", self.intra_mbit)

    def _add_ns(self, ns: str) -> None:
        sh("ip", "netns", "add", ns)
        self.created.append(ns)

    @staticmethod
    def _veth(tmp_a: str, ns_a: str, name_a: str, tmp_b: str, ns_b: str, name_b: str) -> None:
        sh("ip", "link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b)
        for tmp, ns, name in ((tmp_a, ns_a, name_a), (tmp_b, ns_b, name_b)):
            sh("ip", "link", "set", tmp, "netns", ns)
            sh("ip", "-n", ns, "link", "set", tmp, "name", name)

    def cut_bytes(self) -> tuple[int, int]:
        """Bytes sent so far over the cross link: (cluster 0 -> 1, cluster 1 -> 0), from its counters."""
        return self._tx(self.ns("c0"), "x0"), self._tx(self.ns("c1"), "x1")

    @staticmethod
    def _tx(ns: str, dev: str) -> int:
        info = json.loads(sh("ip", "-n", ns, "-j", "-s", "link", "show", "dev", dev))
        return int(info[0]["stats64"]["tx"]["bytes"])

    def down(self) -> None:
        """Delete every namespace this testbed created (veths and bridges go with them). Idempotent."""
        while self.created:
            sh("ip", "netns", "del", self.created.pop(), check=False)


def leftover(prefix: str) -> list[str]:
    """Namespaces whose name starts with ``prefix`` (used by tests to check cleanup)."""
    return [line.split()[0] for line in sh("ip", "netns", "list").splitlines() if line.startswith(prefix)]
