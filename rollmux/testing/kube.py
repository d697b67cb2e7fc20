"""A real Kubernetes control plane on loopback ports, for tests/k8s and benchmarks/k8s_scheduler.py.

etcd (Debian's etcd-server) and kube-apiserver (and, for Jobs, kube-controller-manager with the
node-lifecycle controller off: there is no kubelet, so nodes would turn Unknown and their pods be
evicted) built by ``scripts/build_kube.sh`` into ``$ROLLMUX_KUBE_DIR`` (default
``~/.cache/rollmux/kube-1.20.2``). Nodes are API objects the caller creates; pods are bound, never run.
One admin token (group ``system:masters``) authenticates every client.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from rollmux.core.errors import RollMuxError
from rollmux.core.ports import free_port
from rollmux.k8s.kube import KubeClient, KubeConfig, KubeError

KUBE_VERSION = "1.20.2"
KUBE_DIR = Path(os.environ.get("ROLLMUX_KUBE_DIR", Path.home() / ".cache" / "rollmux" / f"kube-{KUBE_VERSION}"))
APISERVER = KUBE_DIR / "bin" / "kube-apiserver"
CONTROLLER_MANAGER = KUBE_DIR / "bin" / "kube-controller-manager"
ETCD = shutil.which("etcd") or "/usr/bin/etcd"
ADMIN_TOKEN = "rollmux-test-admin"  # a loopback test server's only credential, not a secret


class ControlPlaneError(RollMuxError):
    """The control plane did not come up (the message names the log to read)."""


def missing() -> str:
    """Why no control plane can start here ("" when one can)."""
    for path, how in ((APISERVER, "bash scripts/build_kube.sh"), (Path(ETCD), "apt-get install etcd-server")):
        if not Path(path).exists():
            return f"{path} not found (run `{how}`)"
    return ""


class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager) in `workdir`; `stop()` ends them all."""

    def __init__(self, workdir: Path, *, controller_manager: bool = False,
                 users: dict[str, tuple[str, str]] | None = None) -> None:
        """`users`: more bearer tokens, token -> (user name, comma-separated groups), for RBAC checks."""
        self.dir = workdir
        self.with_kcm = controller_manager
        self.users = dict(users or {})
        self.procs: list[subprocess.Popen[bytes]] = []
        self.etcd_port, self.peer_port, self.port = free_port(), free_port(), free_port()
        self.server = f"https://127.0.0.1:{self.port}"

    def client(self, token: str = ADMIN_TOKEN) -> KubeClient:
        return KubeClient(KubeConfig(server=self.server, token=token, insecure=True))

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115  (the child owns it)
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def start(self, timeout_s: float = 60.0) -> ControlPlane:
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "genrsa", "-out", str(d / "sa.key"), "2048"], check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub")],
                       check=True, capture_output=True)
        (d / "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n' + "".join(
            f'{token},{user},{user},"{groups}"\n' for token, (user, groups) in self.users.items()))
        etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self._spawn("etcd", [ETCD, "--data-dir", str(d / "etcd"), "--listen-client-urls", etcd_url,
                             "--advertise-client-urls", etcd_url,
                             "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port}",
                             "--initial-cluster", f"default=http://127.0.0.1:{self.peer_port}",
                             "--max-request-bytes", str(3 << 19), "--quota-backend-bytes", str(2 << 30)])
        self._spawn("kube-apiserver", [
            str(APISERVER), f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1", f"--secure-port={self.port}", f"--cert-dir={d / 'pki'}",
            "--service-cluster-ip-range=10.0.0.0/24", "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={d / 'sa.pub'}", f"--service-account-signing-key-file={d / 'sa.key'}",
            f"--token-auth-file={d / 'tokens.csv'}", "--authorization-mode=RBAC",
            "--disable-admission-plugins=TaintNodesByCondition,ServiceAccount", "--insecure-port=0",
            "--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000", "--event-ttl=10m",
        ])
        self._wait_ready(timeout_s)
        if self.with_kcm:
            kubeconfig = d / "kubeconfig"
            kubeconfig.write_text(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n"
                f"    server: {self.server}\n    insecure-skip-tls-verify: true\n"
                "users:\n- name: admin\n  user:\n" f"    token: {ADMIN_TOKEN}\n"
                "contexts:\n- name: local\n  context: {cluster: local, user: admin}\ncurrent-context: local\n")
            self._spawn("kube-controller-manager", [
                str(CONTROLLER_MANAGER), f"--kubeconfig={kubeconfig}", "--controllers=job,garbagecollector",
                "--leader-elect=false", "--secure-port=0", "--port=0",
                f"--service-account-private-key-file={d / 'sa.key'}", "--use-service-account-credentials=false",
            ])
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        kube = self.client()
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise ControlPlaneError(f"a control-plane process exited with {p.returncode}: see {self.dir}/*.log")
            try:  # the default namespace exists once the server's bootstrap controllers ran
                kube.get("/api/v1/namespaces/default")
                return
            except KubeError:
                time.sleep(0.2)
        raise ControlPlaneError(f"kube-apiserver not ready within {timeout_s:g} s: see {self.dir}/kube-apiserver.log")

    def stop(self) -> None:
        """Kill every process (their state is a throw-away folder: nothing to shut down cleanly)."""
        for p in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                p.kill()
        for p in self.procs:
            p.wait(10)
        self.procs.clear()
