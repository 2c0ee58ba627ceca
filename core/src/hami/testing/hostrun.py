"""``hami run`` checks every vendor with an isolation library runs unchanged, over its isolation sandbox's fakes.

`HostRunTests` is a test class to subclass in a vendor's isolation tests (``class TestHostRun(HostRunTests):
...``), like `hami.testing.isolation.GrantTests`. It needs the vendor's ``sandbox`` fixture (the fake runtime and
fake device, `hami.testing.sandbox`) and a ``host_world`` fixture of the vendor's own giving a `HostWorld`: the
configuration file and variables that point the vendor's *discovery* at a fake management library or tool
describing one device (index 0) with at least 64 MiB, so that ``hami run --device 0`` finds it. ``hami run`` then
runs as a real process (``python -m hami.cli run``), asks the vendor's hooks, and starts the sandbox's client under
the installed library exactly as it would start any command.

Checked: the granted limit holds for the command and for a child it starts; two commands run with one ``--share``
name share one limit (which ``hami host status`` shows) and an unnamed run beside them has its own; an unnamed run
leaves no file behind; and, as root with ``--user``, the tenant's escapes fail: a child that drops ``LD_PRELOAD``
and the grant variable and raises the limit variable still gets the grant, the grant cannot be written (neither
where the library reads it nor on the host), the preload cannot be unmounted, no user namespace can be made to
mount over it, and no escape tried on the libraries so far (limit variables unset, zeroed, raised or garbled, a
grant of the tenant's own, the accounting file zeroed between two allocations) lifts the limit. The root-only
checks skip where the tests do not run as root (what they need cannot exist there).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

from hami.testing.sandbox import Sandbox

__all__ = ["HostRunTests", "HostWorld", "Tenant"]

MIB = 1 << 20
NOBODY = "nobody"


@dataclass(frozen=True)
class HostWorld:
    """What makes the vendor's discovery find the fake device: a configuration file and variables."""

    config: Path
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Tenant:
    """What the confined checks' tenant (``nobody``) runs: a directory it can reach, the client built there, and
    the variables that point the client at the fakes there."""

    root: Path
    client: Path
    env: Mapping[str, str]


def _host_preload() -> str:
    try:
        return Path("/etc/ld.so.preload").read_text()
    except FileNotFoundError:
        return ""


class HostRunTests:
    """``hami run`` over one vendor's fakes (see the module's doc). A vendor sets `vendor` (its plugin's name)."""

    vendor: ClassVar[str]

    def _argv(self, sandbox: Sandbox, world: HostWorld, *flags: str, state: Path | None = None) -> list[str]:
        state = state or sandbox.root / "state"
        return [
            sys.executable,
            "-m",
            "hami.cli",
            "run",
            "--vendor",
            self.vendor,
            "--device",
            "0",
            "--config",
            str(world.config),
            "--state-dir",
            str(state),
            *flags,
        ]

    def _env(self, sandbox: Sandbox, world: HostWorld) -> dict[str, str]:
        return {**sandbox.env(preload=False), **world.env}

    def hami_run(
        self,
        sandbox: Sandbox,
        world: HostWorld,
        flags: Sequence[str],
        command: Sequence[str | int],
        tenant: Tenant | None = None,
    ) -> subprocess.CompletedProcess[str]:
        state = tenant.root / "state" if tenant else None
        argv = [*self._argv(sandbox, world, *flags, state=state), "--", *map(str, command)]
        env = {**self._env(sandbox, world), **(tenant.env if tenant else {})}
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)

    def _client(self, sandbox: Sandbox) -> str:
        return str(sandbox.build.client)

    # ---------------------------------------------------------------------------------------- the mechanism

    def test_the_granted_limit_holds_for_the_command_and_for_a_child_it_starts(
        self, sandbox: Sandbox, host_world: HostWorld
    ) -> None:
        client = self._client(sandbox)
        unconfined = ["--memory", "8", "--no-namespace"]
        direct = self.hami_run(sandbox, host_world, unconfined, [client, "init", 8 * MIB, "whole"])
        assert direct.returncode == 0, direct.stderr
        child = f"{client} init {8 * MIB} whole && echo child-ok"
        through_shell = self.hami_run(sandbox, host_world, unconfined, ["sh", "-c", child])
        assert through_shell.returncode == 0, through_shell.stderr
        assert "child-ok" in through_shell.stdout
        assert sandbox.device().peak == 8 * MIB
        assert "confines no one" in through_shell.stderr, "the unconfined run says what it does not guarantee"

    def test_two_commands_sharing_a_name_share_one_limit_and_an_unnamed_run_has_its_own(
        self, sandbox: Sandbox, host_world: HostWorld
    ) -> None:
        client = self._client(sandbox)
        flags = ["--memory", "8", "--share", "team-a", "--no-namespace"]
        argv = [*self._argv(sandbox, host_world, *flags), "--", client, "hold", str(6 * MIB), "1"]
        holder = subprocess.Popen(
            argv, env=self._env(sandbox, host_world), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None
            line = holder.stdout.readline()
            assert line.strip() == "held", holder.stderr.read() if holder.stderr else line
            second = self.hami_run(sandbox, host_world, flags, [client, "init", 2 * MIB, "whole"])
            assert second.returncode == 0, f"the share's other 2 MiB were not exactly what was left:\n{second.stderr}"
            own = self.hami_run(
                sandbox, host_world, ["--memory", "8", "--no-namespace"], [client, "init", 8 * MIB, "whole"]
            )
            assert own.returncode == 0, own.stderr
            status = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "hami.cli",
                    "host",
                    "status",
                    "--json",
                    "--state-dir",
                    str(sandbox.root / "state"),
                ],
                env=self._env(sandbox, host_world),
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            (share,) = [r for r in json.loads(status.stdout)["runs"] if r["name"] == "team-a"]
            (device,) = share["devices"]
            assert (device["used_bytes"], device["limit_bytes"], device["granted_mib"]) == (6 * MIB, 8 * MIB, 8)
            assert len(share["processes"]) == 1, "hami host status lists the holder, the one live process"
            other = self.hami_run(
                sandbox, host_world, ["--memory", "16", "--share", "team-a", "--no-namespace"], [client, "init", 0]
            )
            assert other.returncode == 2
            assert "--share: team-a was made for" in other.stderr
        finally:
            holder.terminate()
            holder.communicate(timeout=30)

    def test_an_unnamed_run_leaves_no_file_behind(self, sandbox: Sandbox, host_world: HostWorld) -> None:
        done = self.hami_run(sandbox, host_world, ["--memory", "8", "--no-namespace"], ["true"])
        assert done.returncode == 0, done.stderr
        state = sandbox.root / "state"
        for folder in ("grants", "accounting", "runs"):
            assert list((state / folder).iterdir()) == [], folder

    def test_the_command_exit_status_is_hami_runs(self, sandbox: Sandbox, host_world: HostWorld) -> None:
        done = self.hami_run(sandbox, host_world, ["--memory", "8", "--no-namespace"], ["sh", "-c", "exit 7"])
        assert done.returncode == 7, done.stderr

    def test_a_device_discovery_does_not_report_is_refused_naming_what_it_found(
        self, sandbox: Sandbox, host_world: HostWorld
    ) -> None:
        argv = [*self._argv(sandbox, host_world, "--memory", "8"), "--", "true"]
        argv[argv.index("--device") + 1] = "9"
        done = subprocess.run(
            argv, env=self._env(sandbox, host_world), capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 2
        assert f"hami run: --device: vendor {self.vendor}'s discovery has no device 9 here; it found 0 (" in done.stderr

    def test_a_named_grant_for_containers_is_the_share_hami_run_joins(
        self, sandbox: Sandbox, host_world: HostWorld
    ) -> None:
        state = sandbox.root / "state"
        argv = [
            sys.executable,
            "-m",
            "hami.cli",
            "host",
            "grant",
            "--vendor",
            self.vendor,
            "--device",
            "0",
            "--memory",
            "8",
            "--share",
            "box",
            "--config",
            str(host_world.config),
            "--state-dir",
            str(state),
            "--json",
        ]
        done = subprocess.run(
            argv, env=self._env(sandbox, host_world), capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        grant_dir = state / "grants" / "box"
        assert f"-v {grant_dir}:/etc/hami/grant:ro" in answer["flags"]
        assert f"device 0 {8 * MIB} 0" in (grant_dir / f"{self.vendor}.grant").read_text()
        mounts = {m["container_path"]: m for m in answer["edits"]["mounts"]}
        accounting = Path(answer["accounting_file"])
        inside = [f for f in answer["flags"] if f.startswith("-e ") and accounting.name in f]
        assert len(inside) == 1, "the container is told where its accounting file is, inside a mount"
        path = inside[0].split("=", 1)[1]
        assert str(Path(path).parent) in mounts
        assert f"-v {accounting.parent}:{Path(path).parent}" in answer["flags"]
        client = self._client(sandbox)
        flags = ["--memory", "8", "--share", "box", "--no-namespace"]
        joined = self.hami_run(sandbox, host_world, flags, [client, "init", 8 * MIB, "whole"])
        assert joined.returncode == 0, joined.stderr
        assert accounting.is_file(), "hami run used the grant's accounting file"

    # ---------------------------------------------------------------------------------------- as root: confined

    @pytest.fixture
    def as_root(self, sandbox: Sandbox) -> Iterator[Tenant]:
        """Where another user (``nobody``) can reach what the tenant runs: pytest's temporary directories are
        0700 (and reset so by any session starting), so the built fakes, the fake device's state and the state
        directory move to a directory of their own under /tmp."""
        if os.geteuid() != 0:
            pytest.skip("the confined mode needs root (a private mount namespace and a change of user)")
        root = Path(tempfile.mkdtemp(prefix="hami-hostrun-"))
        try:
            root.chmod(0o755)
            build = root / "build"
            shutil.copytree(sandbox.build.directory, build)
            build.chmod(0o755)
            state = root / "fake.state"
            state.write_bytes(sandbox.fake_state.read_bytes())
            state.chmod(0o666)
            sandbox.fake_state.unlink()
            sandbox.fake_state.symlink_to(state)
            env = {"LD_LIBRARY_PATH": str(build), sandbox.setup.fake_state_variable: str(state)}
            yield Tenant(root, build / sandbox.build.client.name, env)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def _tenant(
        self, sandbox: Sandbox, world: HostWorld, tenant: Tenant, script: str
    ) -> subprocess.CompletedProcess[str]:
        flags = ["--memory", "8", "--user", NOBODY, "--share", "tenant"]
        return self.hami_run(sandbox, world, flags, ["sh", "-c", script], tenant)

    def test_as_root_a_child_that_drops_the_preload_and_raises_its_limit_still_gets_the_grant(
        self, sandbox: Sandbox, host_world: HostWorld, as_root: Tenant
    ) -> None:
        limit = f"{sandbox.setup.memory_limit_variable}_0"
        script = (
            f"id -un; env -u LD_PRELOAD -u HAMI_ISOLATION_GRANT_DIR {limit}=64m "
            f"{as_root.client} init {8 * MIB} whole && echo limited"
        )
        done = self._tenant(sandbox, host_world, as_root, script)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [NOBODY, "limited"]
        assert sandbox.device().peak == 8 * MIB

    def test_as_root_the_tenant_cannot_write_its_grant_or_undo_the_preload(
        self, sandbox: Sandbox, host_world: HostWorld, as_root: Tenant
    ) -> None:
        host_grant = as_root.root / "state" / "grants" / "tenant" / f"{self.vendor}.grant"
        before = _host_preload()
        tries = {
            "grant": f"echo 'device 0 0 0' >> /etc/hami/grant/{self.vendor}.grant",
            "host-grant": f"echo 'device 0 0 0' >> {host_grant}",
            "grant-dir": f"rm -f /etc/hami/grant/{self.vendor}.grant",
            "preload": "echo > /etc/ld.so.preload",
            "umount": "umount /etc/ld.so.preload",
            "umount-grant": "umount /etc/hami/grant",
            "userns": "unshare -Urm sh -c 'mount --bind /dev/null /etc/ld.so.preload'",
        }
        script = "; ".join(
            f"if ({command}) 2>/dev/null; then echo {name}=escaped; else echo {name}=refused; fi"
            for name, command in tries.items()
        )
        done = self._tenant(sandbox, host_world, as_root, script)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [f"{name}=refused" for name in tries], done.stdout
        assert f"device 0 {8 * MIB} 0" in host_grant.read_text()
        assert _host_preload() == before, "the host's own /etc/ld.so.preload is untouched"

    def test_as_root_no_escape_a_tenant_tries_lifts_its_limit(
        self, sandbox: Sandbox, host_world: HostWorld, as_root: Tenant
    ) -> None:
        """Each escape tried on the isolation libraries so far, by a process of the confined run as a pod's would be
        (a private mount namespace, the grant read-only at /etc/hami/grant, user ``nobody`` without capabilities):
        the limit variables unset, zeroed, raised or garbled, HAMi-core's ``<PREFIX>_DISABLE_CONTROL``, the preload
        variable dropped, a grant of its own named by ``HAMI_ISOLATION_GRANT_DIR`` (consulted only where
        /etc/hami/grant does not exist), and the accounting file zeroed between two allocations (the process knows
        what it holds: GRANT.md "A tampered accounting file"). Each child must still get exactly the 8 MiB granted
        (``init <limit> whole``: the whole limit allocated, one byte more refused). The other doors of the linker
        (dlvsym, dlmopen, RTLD_DEEPBIND) are `hami.testing.isolation.LookupTests`', writing the grant or undoing the
        preload the test above."""
        limit = sandbox.setup.memory_limit_variable
        whole = f"{as_root.client} init {8 * MIB} whole"
        own_grant = f"hami-grant 1\\ndevice 0 {64 * MIB} 0\\nend\\n"
        escapes = {
            "unset": f"env -u {limit} -u {limit}_0 {whole}",
            "zeroed": f"env {limit}=0 {limit}_0=0 {whole}",
            "raised": f"env {limit}=64m {limit}_0=64m {whole}",
            "garbled": f"env {limit}=-1 {limit}_0=lots {whole}",
            "disable-control": f"env {limit.split('_')[0]}_DISABLE_CONTROL=true {whole}",
            "no-preload": f"env -u LD_PRELOAD {whole}",
            "own-grant": (
                f"d=$(mktemp -d) && printf '{own_grant}' > $d/{self.vendor}.grant && "
                f"env HAMI_ISOLATION_GRANT_DIR=$d {whole}"
            ),
        }
        script = "; ".join(
            f"if ({command}) >/dev/null 2>&1; then echo {name}=limited; else echo {name}=escaped; fi"
            for name, command in escapes.items()
        )
        accounting = sandbox.setup.accounting_variable
        script += f'; {as_root.client} tamper {6 * MIB} "${accounting}" {6 * MIB} whole'
        done = self._tenant(sandbox, host_world, as_root, script)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.split()
        assert lines[: len(escapes)] == [f"{name}=limited" for name in escapes], done.stdout
        tampered = json.loads(done.stdout.strip().splitlines()[-1])
        assert tampered["first"] == 0
        assert tampered["second"] == tampered["out_of_memory"], "zeroing the accounting file lifted the limit"
        assert "changed behind the library's back" in done.stderr
        assert sandbox.device().peak <= 8 * MIB
