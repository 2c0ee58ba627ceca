"""Start-up: hundreds of processes of one container starting together all initialize (no process waits on
another's slot, no lock is contended for long) with their limits on."""

from __future__ import annotations

MIB = 1 << 20


def test_200_processes_starting_at_once_all_initialize_with_their_limits(sandbox):
    limit = 4 * MIB
    env = sandbox.env(memory=str(limit))
    client = str(sandbox.build.client)
    # each child: aclrtSetDevice, its slot, one byte over the limit refused (its limit is on), one byte allocated
    result = sandbox.client_json("spawn", 200, "--", client, "init", limit, env=env, timeout=120)
    assert result["ok"] == 200, result
    assert result["failed"] == 0
    print(f"200 processes initialized in {result['seconds']:.2f} s")
    account = sandbox.account()
    assert account.processes == ()
    assert account.device(0).memory_used == 0
