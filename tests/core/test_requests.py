"""Reading device requests out of container resources: HAMi's shared rules (protocol.md section 1)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hami.errors import RequestError
from hami.model import AnnotationKeys, Container, ContainerRequest, DeviceKind, ResourceNames
from hami.requests import read_count, read_share_request, share_normalisations

COUNT = "example.com/acc"
MEMORY = "example.com/acc-mem"
PERCENT = "example.com/acc-mem-percentage"
CORES = "example.com/acc-cores"


def _kind(memory_unit_mib: int = 1) -> DeviceKind:
    return DeviceKind(
        common_word="ACC",
        resources=ResourceNames(
            count=COUNT, memory=MEMORY, memory_percentage=PERCENT, cores=CORES, memory_unit_mib=memory_unit_mib
        ),
        annotations=AnnotationKeys(
            node_register="example.com/node-acc-register",
            to_allocate="example.com/acc-devices-to-allocate",
            allocated="example.com/acc-devices-allocated",
        ),
    )


KIND = _kind()


def _limits(**values: str) -> Container:
    names = {"count": COUNT, "memory": MEMORY, "percent": PERCENT, "cores": CORES}
    return Container(name="app", limits={names[k]: v for k, v in values.items()})


def _request(**fields: object) -> ContainerRequest:
    return ContainerRequest(kind="ACC", **fields)


def test_count_only_asks_for_whole_devices() -> None:
    assert read_share_request(KIND, _limits(count="2")) == _request(count=2, memory_percentage=100, cores=100)


def test_count_with_default_memory_asks_for_that_memory() -> None:
    assert read_share_request(KIND, _limits(count="1"), default_memory=2048) == _request(count=1, memory=2048)


def test_count_with_default_memory_and_default_cores() -> None:
    request = read_share_request(KIND, _limits(count="1"), default_memory=2048, default_cores=10)
    assert request == _request(count=1, memory=2048, cores=10)


def test_memory_only_gets_one_device() -> None:
    assert read_share_request(KIND, _limits(memory="3000")) == _request(count=1, memory=3000)


def test_cores_only_gets_one_device_with_all_its_memory() -> None:
    assert read_share_request(KIND, _limits(cores="30")) == _request(count=1, memory_percentage=100, cores=30)


def test_percentage_only_gets_one_device() -> None:
    assert read_share_request(KIND, _limits(percent="50")) == _request(count=1, memory_percentage=50)


def test_count_memory_and_cores_are_per_device() -> None:
    request = read_share_request(KIND, _limits(count="2", memory="4096", cores="25"))
    assert request == _request(count=2, memory=4096, cores=25)


def test_memory_given_uses_default_cores_when_cores_are_not_given() -> None:
    request = read_share_request(KIND, _limits(count="1", memory="4096"), default_cores=5)
    assert request == _request(count=1, memory=4096, cores=5)


def test_count_zero_asks_for_nothing() -> None:
    assert read_share_request(KIND, _limits(count="0")) is None
    assert read_share_request(KIND, _limits(count="0", memory="4096")) is None


def test_container_without_the_resources_asks_for_nothing() -> None:
    assert read_share_request(KIND, Container(name="app", limits={"cpu": "2"})) is None


def test_zero_memory_and_cores_without_count_ask_for_nothing() -> None:
    assert read_share_request(KIND, _limits(memory="0", cores="0")) is None


def test_values_come_from_requests_when_limits_lack_them() -> None:
    container = Container(name="app", limits={COUNT: "1"}, requests={MEMORY: "1024", COUNT: "5"})
    assert read_share_request(KIND, container) == _request(count=1, memory=1024)


def test_memory_in_gi_for_a_mib_resource_is_refused_with_the_mib_to_write() -> None:
    with pytest.raises(RequestError) as info:
        read_share_request(KIND, _limits(count="1", memory="3Gi"))
    err = info.value
    assert err.resource == MEMORY
    assert err.value == "3Gi"
    assert str(err).startswith(f"{MEMORY}: '3Gi' ")
    assert "write 3072" in str(err)
    assert "counts MiB" in str(err)


def test_fractional_binary_unit_suggests_whole_mib() -> None:
    with pytest.raises(RequestError, match="write 1536"):
        read_share_request(KIND, _limits(memory="1.5Gi"))


def test_unit_on_a_scaled_memory_resource_gets_no_mib_suggestion() -> None:
    with pytest.raises(RequestError) as info:
        read_share_request(_kind(256), _limits(memory="1Gi"))
    assert "write" not in str(info.value)
    assert "counts 256 MiB" in str(info.value)


@pytest.mark.parametrize("value", ["1.5", "0.5", "2.0", "1e3"])
def test_decimal_counts_are_refused(value: str) -> None:
    with pytest.raises(RequestError) as info:
        read_share_request(KIND, _limits(count=value))
    assert info.value.resource == COUNT
    assert "is not a plain non-negative integer" in str(info.value)
    assert "counts devices" in str(info.value)


@pytest.mark.parametrize(("field", "resource"), [("count", COUNT), ("memory", MEMORY), ("cores", CORES)])
def test_negative_values_are_refused(field: str, resource: str) -> None:
    with pytest.raises(RequestError) as info:
        read_share_request(KIND, _limits(**{field: "-1"}))
    assert info.value.resource == resource
    assert info.value.value == "-1"


def test_percentage_beside_memory_is_ignored_as_hami_ignores_it() -> None:
    # HAMi: an absolute memory wins over a percentage (pkg/device/nvidia Fit reads the percentage only without it)
    request = read_share_request(KIND, _limits(count="1", memory="4096", percent="50"))
    assert request == _request(count=1, memory=4096)
    assert share_normalisations(KIND, _limits(count="1", memory="4096", percent="50")) == [
        f"{PERCENT}: 50 is ignored because {MEMORY} is given (4096)"
    ]


def test_a_zero_percentage_counts_as_not_given() -> None:
    assert read_share_request(KIND, _limits(count="1", percent="0")) == _request(
        count=1, memory_percentage=100, cores=100
    )
    assert read_share_request(KIND, _limits(count="1", percent="0"), default_memory=1000) == _request(
        count=1, memory=1000
    )
    assert share_normalisations(KIND, _limits(count="1", percent="0")) == [f"{PERCENT}: 0 is read as not given"]


def test_cores_over_100_are_read_as_100() -> None:
    # HAMi clamps every vendor's cores at 100 in Fit: an exclusive device
    assert read_share_request(KIND, _limits(count="1", cores="150")) == _request(
        count=1, memory_percentage=100, cores=100
    )
    assert share_normalisations(KIND, _limits(count="1", cores="150")) == [
        f"{CORES}: 150 is more than 100 percent; read as 100 (the whole device's compute)"
    ]
    assert share_normalisations(KIND, _limits(count="1", cores="100", memory="10")) == []


def test_percentage_over_100_is_refused() -> None:
    with pytest.raises(RequestError, match="more than 100 percent"):
        read_share_request(KIND, _limits(percent="101"))


def test_count_over_the_maximum_is_refused() -> None:
    with pytest.raises(RequestError, match="is more than 8 devices"):
        read_share_request(KIND, _limits(count="9"), max_count=8)


def test_memory_unit_factor_multiplies() -> None:
    assert read_share_request(_kind(256), _limits(count="1", memory="4")) == _request(count=1, memory=1024)


def test_memory_unit_factor_512_multiplies() -> None:
    assert read_share_request(_kind(512), _limits(memory="8")) == _request(count=1, memory=4096)


def test_surrounding_spaces_and_plus_sign_are_accepted() -> None:
    assert read_share_request(KIND, _limits(count=" +2 ", memory="1024 ")) == _request(count=2, memory=1024)


def test_integers_too_long_for_python_are_request_errors() -> None:
    with pytest.raises(RequestError, match="out of range"):
        read_share_request(KIND, _limits(memory="9" * 5000))


def test_read_count_returns_none_when_not_mentioned() -> None:
    assert read_count(Container(name="app"), COUNT) is None


def test_read_count_reads_a_plain_integer() -> None:
    assert read_count(_limits(count="7"), COUNT) == 7


def test_read_count_error_names_the_unit() -> None:
    with pytest.raises(RequestError, match="counts 512 MiB"):
        read_count(_limits(memory="two"), MEMORY, unit="512 MiB")


def test_read_count_error_without_unit_says_whole_units() -> None:
    with pytest.raises(RequestError, match="counts whole units"):
        read_count(_limits(count="x"), COUNT)


def test_read_count_enforces_the_limit_with_its_unit() -> None:
    with pytest.raises(RequestError, match="is more than 16 slices, the largest legal value"):
        read_count(_limits(count="17"), COUNT, unit="slices", limit=16)
    assert read_count(_limits(count="16"), COUNT, unit="slices", limit=16) == 16


_QUANTITY_ALPHABET = "0123456789+-.eEiKMGTmk \t"
quantities = st.one_of(
    st.text(max_size=20),
    st.text(st.sampled_from(_QUANTITY_ALPHABET), max_size=12),
    st.from_regex(r"\A[+-]?[0-9]{1,6}(\.[0-9]{1,3})?\s?(Ki|Mi|Gi|Ti|m|k|M|G)?\Z"),
    st.integers(min_value=-(10**6), max_value=10**6).map(str),
)


@settings(max_examples=300, deadline=None)
@given(
    count=st.none() | quantities,
    memory=st.none() | quantities,
    percent=st.none() | quantities,
    cores=st.none() | quantities,
    unit=st.sampled_from([1, 256, 512]),
)
@example(count=None, memory=None, percent=None, cores="10E", unit=1)  # beyond a quantity's range: was a ValueError
def test_any_resource_values_give_a_request_or_a_request_error(
    count: str | None, memory: str | None, percent: str | None, cores: str | None, unit: int
) -> None:
    values = {"count": count, "memory": memory, "percent": percent, "cores": cores}
    container = _limits(**{k: v for k, v in values.items() if v is not None})
    try:
        result = read_share_request(_kind(unit), container)
    except RequestError as err:
        error = err
    else:
        assert result is None or isinstance(result, ContainerRequest)
        return
    assert type(error) is RequestError
    assert error.resource in (COUNT, MEMORY, PERCENT, CORES)
    assert str(error).startswith(f"{error.resource}: ")
