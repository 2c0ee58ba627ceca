"""``hami run``'s environment on a host of several devices: the runtime's selector names the host's indices of the
chosen devices, not the container's own numbering the container edits give (hami_host_environment)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hami.host.run import parse_request, plan


def test_hami_run_selects_the_chosen_devices_by_their_host_indices(
    mthreads_node: Callable[..., Any], fakes: Any, tmp_path: Path
) -> None:
    plugins = mthreads_node(fakes.s4000_server(4)).plugins(sharingMode="hami-core", hookPath=str(tmp_path / "hook"))
    request = parse_request({"--vendor": "mthreads", "--device": "3,1", "--memory": "1024", "COMMAND": ["true"]})
    launch = plan(request, plugins, tmp_path / "state", confined=False, environ={})
    assert launch.env["MUSA_VISIBLE_DEVICES"] == "3,1"  # the container's edits say 0,1: the host's first two devices
    assert launch.edits.env["MUSA_VISIBLE_DEVICES"] == "0,1"
    assert launch.edits.env["MTHREADS_VISIBLE_DEVICES"] == "3,1"
