"""What the real API server does to the values HAMi reads, pinned here without a server.

kube-apiserver stores resource quantities in canonical form: a pod written with `nvidia.com/gpumem: "3000"`
comes back (to the webhook, the extender and the node daemon) as `3k`, and a node capacity of 2000 as `2k`.
The end-to-end suite found the request reader refusing `3k`; these tests keep the fix honest on the unit level.
"""

from __future__ import annotations

import pytest

from hami.errors import RequestError
from hami.model import Container
from hami.requests import read_count
from hami.scheduler.nodes import _devices_from_capacity


@pytest.mark.parametrize(
    ("written", "stored", "value"),
    [("3000", "3k", 3000), ("15000", "15k", 15000), ("1000000", "1M", 1_000_000), ("12345", "12345", 12345)],
)
def test_a_request_in_canonical_form_reads_as_the_integer_the_user_wrote(written: str, stored: str, value: int) -> None:
    for raw in (written, stored):
        assert (
            read_count(Container(name="c", limits={"nvidia.com/gpumem": raw}), "nvidia.com/gpumem", unit="MiB") == value
        )


@pytest.mark.parametrize("raw", ["1.5", "3Gi", "500m"])
def test_fractions_and_binary_units_are_still_refused(raw: str) -> None:
    with pytest.raises(RequestError):
        read_count(Container(name="c", limits={"nvidia.com/gpumem": raw}), "nvidia.com/gpumem", unit="MiB")


def test_a_capacity_in_canonical_form_counts_its_devices() -> None:
    from hami.plugins import VendorPlugins

    plugins = VendorPlugins.load()
    kind = next(k for v in plugins.vendors for k in v.info.kinds if k.common_word == "MLU")
    node = {
        "metadata": {"name": "n"},
        "status": {"capacity": {"cambricon.com/mlu.smlu.vcore": "200", "cambricon.com/mlu.smlu.vmemory": "2k"}},
    }
    devices = _devices_from_capacity(node, kind)
    assert len(devices) == 2
    assert devices[0].devmem == 1000 * kind.resources.memory_unit_mib
