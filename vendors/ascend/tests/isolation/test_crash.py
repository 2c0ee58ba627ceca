"""Crashes: a process killed anywhere (even inside the accounting lock) leaves no lock held and no usage behind,
and after hundreds of kills a new process starts at once with its limits on."""

from __future__ import annotations

import json
import os
import signal
import subprocess

MIB = 1 << 20
FUTEX_OWNER_DIED = 0x40000000
FUTEX_TID_MASK = 0x3FFFFFFF


def test_a_process_killed_holding_the_lock_leaves_it_usable_and_its_memory_reclaimed(sandbox):
    limit = 16 * MIB
    # The victim holds the lock for 0.5 s during its second allocation (a test-only delay inside the lock).
    victim = sandbox.start(
        "hold", 10 * MIB, 2, env=sandbox.env(memory=str(limit), extra={"HAMI_ISOLATION_TEST_LOCK_HOLD_US": "500000"})
    )
    sandbox.wait_for(lambda: sandbox.running() and sandbox.account().device(0).memory_used == 10 * MIB, 10,
                     "the victim to be inside the lock with its second allocation counted")  # fmt: skip
    owner = sandbox.lock_word() & FUTEX_TID_MASK
    assert owner, "the lock is not held"
    assert os.path.exists(f"/proc/{victim.pid}/task/{owner}"), "a thread of the victim holds the lock"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert sandbox.lock_word() & FUTEX_OWNER_DIED, "the kernel marked the lock's owner dead"

    # A new process of the container gets the lock at once, and the whole limit: nothing of the victim is left.
    sandbox.client("init", limit, "whole", env=sandbox.env(memory=str(limit)), timeout=10)
    account = sandbox.account()
    assert account.device(0).memory_used == 0
    assert account.processes == ()
    assert sandbox.lock_word() == 0


def test_a_process_killed_outside_the_lock_has_its_memory_reclaimed(sandbox):
    limit = 32 * MIB
    victim = sandbox.start("hold", 20 * MIB, 4, env=sandbox.env(memory=str(limit)))
    assert victim.stdout.readline().strip() == "held"
    assert sandbox.account().processes[0].memory_used == 20 * MIB
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert sandbox.account().device(0).memory_used == 20 * MIB  # nobody noticed yet
    sandbox.client("init", limit, "whole", env=sandbox.env(memory=str(limit)), timeout=10)
    assert sandbox.account().device(0).memory_used == 0


def test_a_process_that_exits_holding_memory_is_counted_until_it_is_gone(sandbox):
    code = (
        "acl = load_acl(); use_device(acl); p = c_void_p()\n"
        "assert acl.aclrtMallocAlign32(byref(p), c_size_t(5 << 20), 0) == 0\n"
    )
    sandbox.python(code, sandbox.env(memory="8m"))
    account = sandbox.account()
    assert account.device(0).memory_used == 5 * MIB  # the driver frees it only once the process is gone
    assert len(account.processes) == 1
    sandbox.client("init", 8 * MIB, "whole", env=sandbox.env(memory="8m"), timeout=10)
    account = sandbox.account()
    assert account.device(0).memory_used == 0
    assert account.processes == ()


def test_after_a_storm_of_kills_a_new_process_starts_at_once_with_its_limits_on(sandbox):
    limit = 24 * MIB
    churn_env = sandbox.env(
        memory=str(limit), extra={"HAMI_ISOLATION_TEST_LOCK_HOLD_US": "300", "LIBVNPU_LOG_LEVEL": "1"}
    )
    argv = [str(sandbox.build.client), "churn", str(8 * MIB)]
    proc = subprocess.run(
        [str(sandbox.build.client), "storm", "300", "12", "20000", "--", *argv],
        env=churn_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    storm = json.loads(proc.stdout.strip().splitlines()[-1])
    assert storm["killed"] >= 290, storm
    recoveries = proc.stderr.count("a process died holding the accounting lock")
    assert recoveries > 0, "no process was ever killed inside the lock: the storm proves less than it should"

    sandbox.client("init", limit, "whole", env=sandbox.env(memory=str(limit)), timeout=10)
    account = sandbox.account()
    assert account.device(0).memory_used == 0
    assert account.processes == ()
    assert sandbox.lock_word() == 0, "the lock is free"
