"""HAMi's annotation encodings (protocol.md sections 2 and 3): golden examples, semantics, round trips, fuzzing."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.codec import (
    AnnotationError,
    Handshake,
    MigReservation,
    NodeLock,
    decode_handshake,
    decode_legacy_register,
    decode_link_scores,
    decode_mig_allocations,
    decode_node_lock,
    decode_node_register,
    decode_pod_devices,
    encode_handshake,
    encode_legacy_register,
    encode_link_scores,
    encode_mig_allocations,
    encode_node_lock,
    encode_node_register,
    encode_pod_devices,
)
from hami.errors import HamiError
from hami.model import ContainerDevice, Device

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------------------------------------
# Golden examples from protocol.md
# --------------------------------------------------------------------------------------------------------

NVIDIA_REGISTER = (
    '[{"id":"GPU-0","count":10,"devmem":8192,"devcore":100,"type":"NVIDIA-A100","numa":0,"health":true,'
    '"index":0,"mode":"hami-core"}]'
)


def test_nvidia_register_example_decodes_to_its_device() -> None:
    assert decode_node_register(NVIDIA_REGISTER, "hami.io/node-nvidia-register") == [
        Device(
            id="GPU-0",
            count=10,
            devmem=8192,
            devcore=100,
            type="NVIDIA-A100",
            numa=0,
            health=True,
            index=0,
            mode="hami-core",
        )
    ]


def test_nvidia_register_example_reencodes_byte_for_byte() -> None:
    assert encode_node_register(decode_node_register(NVIDIA_REGISTER)) == NVIDIA_REGISTER


def test_register_with_several_devices_and_mig_profiles_reencodes_byte_for_byte() -> None:
    value = (
        '[{"id":"GPU-0","count":10,"devmem":40960,"devcore":100,"type":"NVIDIA-A100-SXM4-40GB","numa":0,'
        '"health":true,"index":0,"mode":"hami-core"},'
        '{"id":"GPU-1","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA-A100-SXM4-40GB","numa":1,'
        '"index":1,"mode":"mig","migProfiles":[{"name":"1g.5gb","memoryMB":4864,"core":14}]}]'
    )
    devices = decode_node_register(value)
    assert [d.id for d in devices] == ["GPU-0", "GPU-1"]
    assert devices[1].health is False
    assert devices[1].mig_profiles == ({"name": "1g.5gb", "memoryMB": 4864, "core": 14},)
    assert encode_node_register(devices) == value


POD_THREE_CONTAINERS = ";GPU-A,NVIDIA,2500,25:;GPU-B,NVIDIA,2500,25:;"
POD_MULTI_GPU = "GPU-A,NVIDIA,3000,30:GPU-B,NVIDIA,3000,30:;"


def test_pod_devices_example_keeps_the_init_containers_empty_entry() -> None:
    assert decode_pod_devices(POD_THREE_CONTAINERS, "hami.io/vgpu-devices-allocated") == (
        (),
        (ContainerDevice(uuid="GPU-A", type="NVIDIA", usedmem=2500, usedcores=25),),
        (ContainerDevice(uuid="GPU-B", type="NVIDIA", usedmem=2500, usedcores=25),),
    )


def test_pod_devices_multi_gpu_example_is_one_container_with_two_devices() -> None:
    assert decode_pod_devices(POD_MULTI_GPU) == (
        (
            ContainerDevice(uuid="GPU-A", type="NVIDIA", usedmem=3000, usedcores=30),
            ContainerDevice(uuid="GPU-B", type="NVIDIA", usedmem=3000, usedcores=30),
        ),
    )


@pytest.mark.parametrize("value", [POD_THREE_CONTAINERS, POD_MULTI_GPU, ";", ";;", ";GPU-A,NVIDIA,0,0:;;"])
def test_pod_devices_examples_reencode_byte_for_byte(value: str) -> None:
    assert encode_pod_devices(decode_pod_devices(value)) == value


MIG_RESERVED = (
    '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-x","profile":"2g.10gb","placement":{"start":2,"size":2}}]'
)
MIG_REALIZED = (
    '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-x","profile":"2g.10gb","placement":{"start":2,"size":2},'
    '"migUUID":"MIG-a5fa6120-f6fa-51b6-9820-a42112640629","gpuInstanceID":4,"computeInstanceID":0}]'
)


def test_mig_reservation_example_decodes() -> None:
    assert decode_mig_allocations(MIG_RESERVED) == [
        MigReservation(container_index=0, device_index=0, gpu_uuid="GPU-x", profile="2g.10gb", start=2, size=2)
    ]


def test_mig_reservation_with_runtime_identity_decodes() -> None:
    assert decode_mig_allocations(MIG_REALIZED) == [
        MigReservation(
            container_index=0,
            device_index=0,
            gpu_uuid="GPU-x",
            profile="2g.10gb",
            start=2,
            size=2,
            mig_uuid="MIG-a5fa6120-f6fa-51b6-9820-a42112640629",
            gpu_instance_id=4,
            compute_instance_id=0,
        )
    ]


@pytest.mark.parametrize("value", [MIG_RESERVED, MIG_REALIZED])
def test_mig_examples_reencode_byte_for_byte(value: str) -> None:
    assert encode_mig_allocations(decode_mig_allocations(value)) == value


LINK_SCORES = (
    '[{"uuid":"GPU-a","score":{"GPU-b":200,"GPU-c":20}},'
    '{"uuid":"GPU-b","score":{"GPU-a":200,"GPU-c":20}},'
    '{"uuid":"GPU-c","score":{"GPU-a":20,"GPU-b":20}}]'
)


def test_link_scores_example_decodes_to_pairwise_table() -> None:
    assert decode_link_scores(LINK_SCORES, "hami.io/node-nvidia-score") == {
        "GPU-a": {"GPU-b": 200, "GPU-c": 20},
        "GPU-b": {"GPU-a": 200, "GPU-c": 20},
        "GPU-c": {"GPU-a": 20, "GPU-b": 20},
    }


def test_link_scores_example_reencodes_byte_for_byte() -> None:
    assert encode_link_scores(decode_link_scores(LINK_SCORES)) == LINK_SCORES


def test_link_scores_peers_are_written_sorted_like_a_go_map() -> None:
    assert encode_link_scores({"GPU-b": {"GPU-c": 1, "GPU-a": 2}}) == '[{"uuid":"GPU-b","score":{"GPU-a":2,"GPU-c":1}}]'


def test_link_scores_device_without_peers_omits_score_like_go_omitempty() -> None:
    assert encode_link_scores({"GPU-a": {}}) == '[{"uuid":"GPU-a"}]'
    assert decode_link_scores('[{"uuid":"GPU-a"}]') == {"GPU-a": {}}


HYGON_7 = "DCU-123,4,16384,100,DCU-Z100,0,true:"
HYGON_7_SEVERAL = (
    "DCU-123,4,16384,100,DCU-Z100,0,true:DCU-124,4,16384,100,DCU-Z100,0,true:DCU-125,4,16384,100,DCU-Z100,1,false:"
)
ILUVATAR_9 = (
    "GPU-6d3e2a48-2b1f-4c3b-9a53-0c8f3d1e7a10,4,32768,100,BI-V100,0,true,0,hami-core:"
    "GPU-9f0e1d2c-3b4a-4596-8877-665544332211,4,32768,100,BI-V100,1,true,1,hami-core:"
)


def test_legacy_register_with_seven_fields_decodes() -> None:
    assert decode_legacy_register(HYGON_7, "hami.io/node-dcu-register") == [
        Device(id="DCU-123", count=4, devmem=16384, devcore=100, type="DCU-Z100", numa=0, health=True)
    ]


def test_legacy_register_with_several_seven_field_entries_decodes_each() -> None:
    devices = decode_legacy_register(HYGON_7_SEVERAL)
    assert [(d.id, d.numa, d.health) for d in devices] == [
        ("DCU-123", 0, True),
        ("DCU-124", 0, True),
        ("DCU-125", 1, False),
    ]


@pytest.mark.parametrize("value", [HYGON_7, HYGON_7_SEVERAL])
def test_legacy_register_seven_fields_reencodes_byte_for_byte(value: str) -> None:
    assert encode_legacy_register(decode_legacy_register(value), fields=7) == value


def test_legacy_register_with_nine_fields_decodes_index_and_mode() -> None:
    devices = decode_legacy_register(ILUVATAR_9, "hami.io/node-BI-V100-register")
    assert devices == [
        Device(
            id="GPU-6d3e2a48-2b1f-4c3b-9a53-0c8f3d1e7a10",
            count=4,
            devmem=32768,
            devcore=100,
            type="BI-V100",
            numa=0,
            health=True,
            index=0,
            mode="hami-core",
        ),
        Device(
            id="GPU-9f0e1d2c-3b4a-4596-8877-665544332211",
            count=4,
            devmem=32768,
            devcore=100,
            type="BI-V100",
            numa=1,
            health=True,
            index=1,
            mode="hami-core",
        ),
    ]


def test_legacy_register_nine_fields_reencodes_byte_for_byte() -> None:
    assert encode_legacy_register(decode_legacy_register(ILUVATAR_9)) == ILUVATAR_9


@pytest.mark.parametrize(("text", "health"), [("true", True), ("1", True), ("T", True), ("False", False), ("0", False)])
def test_legacy_register_health_accepts_go_parsebool_spellings(text: str, health: bool) -> None:
    assert decode_legacy_register(f"DCU-1,4,16384,100,Z100,0,{text}:")[0].health is health


def test_node_lock_example_decodes() -> None:
    lock = decode_node_lock("2025-01-02T03:04:05Z,default,pod-a")
    assert lock == NodeLock(datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC), "default", "pod-a")
    assert lock.uid == ""


@pytest.mark.parametrize(
    "value",
    [
        "2025-01-02T03:04:05Z,default,pod-a",
        "2025-01-02T03:04:05Z,default,pod-a,6f1c2b7e-0d4a-4f3e-9c1b-2a3d4e5f6a7b",
        "2025-01-02T11:04:05+08:00,default,pod-a",
        "2025-01-01T22:04:05-05:00,ml-team,trainer-0,uid-1",
    ],
)
def test_node_lock_examples_reencode_byte_for_byte(value: str) -> None:
    assert encode_node_lock(decode_node_lock(value)) == value


def test_node_lock_uid_field_is_read() -> None:
    lock = decode_node_lock("2025-01-02T03:04:05Z,default,pod-a,6f1c2b7e")
    assert (lock.namespace, lock.name, lock.uid) == ("default", "pod-a", "6f1c2b7e")


def test_node_lock_with_offset_is_the_same_instant() -> None:
    lock = decode_node_lock("2025-01-02T11:04:05+08:00,default,pod-a")
    assert lock.time == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert lock.time.utcoffset() == timedelta(hours=8)


def test_node_lock_bare_time_has_no_owner() -> None:
    assert decode_node_lock("2025-01-02T03:04:05Z") == NodeLock(datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC))


def test_node_lock_naive_time_is_written_as_utc() -> None:
    assert encode_node_lock(NodeLock(datetime(2025, 1, 2, 3, 4, 5), "default", "pod-a")) == (
        "2025-01-02T03:04:05Z,default,pod-a"
    )


def test_node_lock_drops_fractional_seconds_like_go_rfc3339() -> None:
    t = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    assert encode_node_lock(NodeLock(t, "default", "pod-a")) == "2025-01-02T03:04:05Z,default,pod-a"
    assert decode_node_lock("2025-01-02T03:04:05.678Z,default,pod-a").time == t.replace(microsecond=0)


@pytest.mark.parametrize("state", ["Requesting", "Reported", "Deleted"])
def test_handshake_examples_decode_and_reencode_byte_for_byte(state: str) -> None:
    value = f"{state}_2025-01-02 03:04:05"
    handshake = decode_handshake(value, "hami.io/node-handshake")
    assert handshake == Handshake(state, datetime(2025, 1, 2, 3, 4, 5))  # type: ignore[arg-type]
    assert encode_handshake(handshake) == value


def test_handshake_pads_years_to_four_digits_like_go() -> None:
    value = encode_handshake(Handshake("Requesting", datetime(999, 1, 2, 3, 4, 5)))
    assert value == "Requesting_0999-01-02 03:04:05"
    assert decode_handshake(value).time == datetime(999, 1, 2, 3, 4, 5)


# --------------------------------------------------------------------------------------------------------
# Semantics
# --------------------------------------------------------------------------------------------------------


def test_device_without_health_key_is_unhealthy() -> None:
    (device,) = decode_node_register('[{"id":"GPU-0","count":10,"devmem":8192}]')
    assert device.health is False


def test_absent_register_keys_take_go_zero_values() -> None:
    (device,) = decode_node_register('[{"id":"GPU-0"}]')
    assert (device.count, device.devmem, device.devcore, device.type, device.numa, device.index, device.mode) == (
        0,
        0,
        0,
        "",
        0,
        0,
        "",
    )


def test_null_register_values_take_go_zero_values() -> None:
    (device,) = decode_node_register('[{"id":"GPU-0","count":null,"type":null,"health":null,"migProfiles":null}]')
    assert (device.count, device.type, device.health, device.mig_profiles) == (0, "", False, ())


def test_register_keys_are_matched_case_insensitively() -> None:
    (device,) = decode_node_register(
        '[{"ID":"GPU-1","Devmem":4096,"COUNT":2,"DevCore":50,"Type":"NVIDIA-T4","Health":true,"Index":3,"NUMA":1}]'
    )
    assert device == Device(
        id="GPU-1", devmem=4096, count=2, devcore=50, type="NVIDIA-T4", health=True, index=3, numa=1
    )


def test_register_accepts_hami_migtemplate_key() -> None:
    value = '[{"id":"GPU-1","health":true,"mode":"mig","migtemplate":[[{"name":"1g.10gb","memory":10240,"count":7}]]}]'
    (device,) = decode_node_register(value)
    assert device.mig_profiles == ([{"name": "1g.10gb", "memory": 10240, "count": 7}],)


def test_register_unknown_keys_are_ignored() -> None:
    (device,) = decode_node_register('[{"id":"GPU-1","health":true,"futureField":{"x":1}}]')
    assert device.id == "GPU-1"


def test_register_reads_devicevendor_and_custominfo() -> None:
    (device,) = decode_node_register('[{"id":"GPU-1","devicevendor":"NVIDIA","custominfo":{"pcie":"0000:3b:00.0"}}]')
    assert device.vendor == "NVIDIA"
    assert device.custom == {"pcie": "0000:3b:00.0"}


def test_register_custominfo_keys_are_written_sorted_like_a_go_map() -> None:
    device = Device(id="GPU-1", health=False, custom={"b": 1, "a": {"z": 1, "y": 2}})
    assert encode_node_register([device]).endswith('"custominfo":{"a":{"y":2,"z":1},"b":1}}]')


def test_register_zero_values_are_omitted_but_numa_and_index_are_written() -> None:
    assert (
        encode_node_register([Device(id="GPU-0", count=0, devcore=0, health=False)])
        == '[{"id":"GPU-0","numa":0,"index":0}]'
    )


@pytest.mark.parametrize("value", ["", "   ", "null", "[]"])
def test_empty_json_annotations_decode_to_empty(value: str) -> None:
    assert decode_node_register(value) == []
    assert decode_link_scores(value) == {}
    assert decode_mig_allocations(value) == []


def test_empty_string_annotations_decode_to_empty() -> None:
    assert decode_legacy_register("") == []
    assert decode_pod_devices("") == ()


def test_encoders_of_nothing_write_empty_values() -> None:
    assert encode_node_register([]) == "[]"
    assert encode_legacy_register([]) == ""
    assert encode_pod_devices([]) == ""
    assert encode_link_scores({}) == "[]"
    assert encode_mig_allocations([]) == "[]"


def test_json_encoders_escape_html_characters_like_go() -> None:
    encoded = encode_node_register([Device(id="GPU-<a>&b", type="NVIDIA-\u2028x", health=True)])
    for raw in ("<", ">", "&", "\u2028"):
        assert raw not in encoded
    assert '"id":"GPU-\\u003ca\\u003e\\u0026b"' in encoded
    assert '"type":"NVIDIA-\\u2028x"' in encoded
    assert decode_node_register(encoded)[0].id == "GPU-<a>&b"


def test_json_encoders_keep_other_non_ascii_text_literal_like_go() -> None:
    assert encode_link_scores({"GPU-é": {"GPU-ü": 1}}) == '[{"uuid":"GPU-é","score":{"GPU-ü":1}}]'


def test_mig_allocation_keys_are_matched_case_insensitively() -> None:
    value = (
        '[{"ContainerIndex":1,"DEVICEINDEX":0,"GPUUUID":"GPU-x","Profile":"1g.5gb","Placement":{"Start":0,"Size":1}}]'
    )
    assert decode_mig_allocations(value) == [
        MigReservation(container_index=1, device_index=0, gpu_uuid="GPU-x", profile="1g.5gb", start=0, size=1)
    ]


def test_link_score_keys_are_matched_case_insensitively() -> None:
    assert decode_link_scores('[{"UUID":"GPU-a","Score":{"GPU-b":5}}]') == {"GPU-a": {"GPU-b": 5}}


def test_link_score_peer_names_keep_their_case() -> None:
    assert decode_link_scores('[{"uuid":"GPU-a","score":{"GPU-B":5,"gpu-b":6}}]') == {"GPU-a": {"GPU-B": 5, "gpu-b": 6}}


@pytest.mark.parametrize(
    "value",
    [
        '[{"containerIndex":0,"deviceIndex":0,"profile":"1g.5gb","placement":{"start":0,"size":1}}]',
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-x","profile":"","placement":{"start":0,"size":1}}]',
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-x","profile":"1g.5gb","placement":{"start":0,"size":0}}]',
        '[{"containerIndex":-1,"deviceIndex":0,"gpuUUID":"GPU-x","profile":"1g.5gb","placement":{"start":0,"size":1}}]',
        '[{"deviceIndex":0,"gpuUUID":"GPU-x","profile":"1g.5gb","placement":{"start":0,"size":1}}]',
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-x","profile":"1g.5gb"}]',
    ],
)
def test_incomplete_mig_reservation_is_refused(value: str) -> None:
    with pytest.raises(AnnotationError):
        decode_mig_allocations(value)


def test_json_nan_and_infinity_are_refused_as_go_does() -> None:
    for value in ['[{"id":"GPU-0","custominfo":{"x":NaN}}]', '[{"id":"GPU-0","custominfo":{"x":1e400}}]']:
        with pytest.raises(AnnotationError, match="not valid JSON"):
            decode_node_register(value)


def test_integral_json_floats_are_read_as_integers() -> None:
    assert decode_node_register('[{"id":"GPU-0","devmem":8192.0}]')[0].devmem == 8192


def test_legacy_register_integers_may_carry_a_sign_and_spaces() -> None:
    assert decode_legacy_register("DCU-1, +4 ,16384,100,Z100,-1,true:")[0].count == 4


def test_legacy_register_negative_count_is_refused() -> None:
    with pytest.raises(AnnotationError, match="count"):
        decode_legacy_register("DCU-1,-4,16384,100,Z100,0,true:")


def test_legacy_register_entry_without_trailing_colon_is_read() -> None:
    assert decode_legacy_register("DCU-1,4,16384,100,Z100,0,true")[0].id == "DCU-1"


def test_pod_devices_without_trailing_semicolon_are_read() -> None:
    assert decode_pod_devices("GPU-A,NVIDIA,1000,10:") == (
        (ContainerDevice(uuid="GPU-A", type="NVIDIA", usedmem=1000, usedcores=10),),
    )


def test_pod_devices_negative_usage_is_refused() -> None:
    with pytest.raises(AnnotationError, match="usedmem"):
        decode_pod_devices("GPU-A,NVIDIA,-1,10:;")


def test_pod_device_encoding_keeps_empty_container_entries() -> None:
    device = ContainerDevice(uuid="GPU-A", type="NVIDIA", usedmem=1024, usedcores=0)
    assert encode_pod_devices([(), (device,), ()]) == ";GPU-A,NVIDIA,1024,0:;;"


@pytest.mark.parametrize(
    "value",
    [
        "2025-01-02T03:04:05,default,pod-a",  # no zone
        "2025-01-02 03:04:05Z,default,pod-a",  # not RFC 3339
        "2025-01-02T03:04:05Z,default",  # two fields
        "2025-01-02T03:04:05Z,default,pod-a,uid,extra",
        "",
    ],
)
def test_malformed_node_lock_is_refused(value: str) -> None:
    with pytest.raises(AnnotationError):
        decode_node_lock(value)


@pytest.mark.parametrize(
    "value", ["Requesting", "Requesting_", "Asking_2025-01-02 03:04:05", "Requesting_2025-01-02T03:04:05Z", ""]
)
def test_malformed_handshake_is_refused(value: str) -> None:
    with pytest.raises(AnnotationError):
        decode_handshake(value)


@pytest.mark.parametrize(
    "decode",
    [
        pytest.param(lambda v: decode_legacy_register(f"DCU-1,{v},16384,100,Z100,0,true:"), id="legacy"),
        pytest.param(lambda v: decode_pod_devices(f"GPU-A,NVIDIA,{v},10:;"), id="pod"),
    ],
)
def test_integers_too_long_for_python_are_annotation_errors(decode: Callable[[str], Any]) -> None:
    with pytest.raises(AnnotationError, match="out of range"):
        decode("9" * 5000)


def test_annotation_error_is_a_hami_error_and_a_value_error() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_node_register("{")
    assert isinstance(info.value, HamiError)
    assert isinstance(info.value, ValueError)


# --------------------------------------------------------------------------------------------------------
# Error messages
# --------------------------------------------------------------------------------------------------------


def test_legacy_register_error_names_annotation_entry_and_the_expected_fields() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_legacy_register("DCU-1,4,16384,100,Z100,0,true:DCU-2,4,16384:", "hami.io/node-dcu-register")
    err = info.value
    assert err.annotation == "hami.io/node-dcu-register"
    assert err.part == "DCU-2,4,16384"
    assert str(err).startswith("annotation hami.io/node-dcu-register: ")
    assert "3 fields" in str(err)
    assert "7 (id,count,devmem,devcore,type,numa,health)" in str(err)
    assert "'DCU-2,4,16384'" in str(err)


def test_legacy_register_bad_number_names_the_field() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_legacy_register("DCU-1,4,16GiB,100,Z100,0,true:", "hami.io/node-dcu-register")
    assert info.value.part == "DCU-1,4,16GiB,100,Z100,0,true"
    assert "devmem '16GiB' is not an integer" in str(info.value)


def test_legacy_register_bad_health_says_true_or_false() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_legacy_register("DCU-1,4,16384,100,Z100,0,yes:", "hami.io/node-dcu-register")
    assert "is not true or false" in str(info.value)


def test_pod_devices_error_names_the_device_and_the_expected_shape() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_pod_devices(";GPU-A,NVIDIA,2500:;", "hami.io/vgpu-devices-to-allocate")
    err = info.value
    assert err.annotation == "hami.io/vgpu-devices-to-allocate"
    assert err.part == "GPU-A,NVIDIA,2500"
    assert "<UUID>,<Type>,<Usedmem>,<Usedcores>" in str(err)


def test_pod_devices_bad_number_names_the_field() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_pod_devices("GPU-A,NVIDIA,lots,25:;", "hami.io/vgpu-devices-allocated")
    assert info.value.part == "GPU-A,NVIDIA,lots,25"
    assert "usedmem 'lots' is not an integer" in str(info.value)


def test_node_lock_error_shows_a_well_formed_time() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_node_lock("2025-01-02T03:04:05,default,pod-a", "hami.io/mutex.lock")
    assert info.value.annotation == "hami.io/mutex.lock"
    assert info.value.part == "2025-01-02T03:04:05"
    assert "2025-01-02T03:04:05Z" in str(info.value)


def test_node_lock_error_for_field_count_shows_the_layout() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_node_lock("2025-01-02T03:04:05Z,pod-a", "hami.io/mutex.lock")
    assert info.value.part == "2025-01-02T03:04:05Z,pod-a"
    assert "<RFC3339 time>,<namespace>,<name>[,<uid>]" in str(info.value)


def test_node_lock_error_for_unparsable_time_names_rfc3339() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_node_lock("yesterday,default,pod-a")
    assert info.value.part == "yesterday"
    assert "RFC 3339" in str(info.value)


def test_handshake_error_for_bad_time_shows_a_well_formed_time() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_handshake("Requesting_now", "hami.io/node-handshake-dcu")
    assert info.value.annotation == "hami.io/node-handshake-dcu"
    assert info.value.part == "now"
    assert "2025-01-02 03:04:05" in str(info.value)


def test_handshake_error_for_bad_state_lists_the_states() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_handshake("Hello", "hami.io/node-handshake")
    assert info.value.part == "Hello"
    assert "Requesting_<time>, Reported_<time> or Deleted_<time>" in str(info.value)


def test_json_syntax_error_says_not_valid_json() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_node_register('[{"id":"GPU-0",}]', "hami.io/node-nvidia-register")
    assert info.value.annotation == "hami.io/node-nvidia-register"
    assert info.value.part == '[{"id":"GPU-0",}]'
    assert "not valid JSON" in str(info.value)


def test_register_that_is_not_an_array_says_an_array_is_expected() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_node_register('{"id":"GPU-0"}', "hami.io/node-nvidia-register")
    assert "expected a JSON array of device objects" in str(info.value)


def test_register_field_of_wrong_type_is_named() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_node_register('[{"id":"GPU-0","devmem":"8Gi"}]', "hami.io/node-nvidia-register")
    assert info.value.part == "devmem='8Gi'"
    assert "'devmem' must be an integer" in str(info.value)


def test_register_device_failing_validation_names_the_device_and_the_field() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_node_register('[{"id":"GPU-0","devmem":-1}]', "hami.io/node-nvidia-register")
    assert info.value.part == '{"id":"GPU-0","devmem":-1}'
    assert "devmem" in str(info.value)
    assert "greater than or equal to 0" in str(info.value)


def test_register_device_id_with_separator_is_refused_with_reason() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_node_register('[{"id":"GPU-0:1"}]', "hami.io/node-nvidia-register")
    assert "':'" in str(info.value)
    assert "separator" in str(info.value)


def test_mig_error_names_the_missing_field() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_mig_allocations(
            '[{"containerIndex":0,"gpuUUID":"GPU-x","profile":"1g.5gb","placement":{"start":0,"size":1}}]'
        )
    assert "device_index is missing or out of range" in str(info.value)
    assert info.value.annotation == "hami.io/vgpu-mig-allocations"


def test_mig_error_for_missing_placement_shows_its_shape() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_mig_allocations('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-x","profile":"1g.5gb"}]')
    assert '"placement": {"start":…,"size":…}' in str(info.value)


def test_link_scores_error_for_non_integer_score_names_the_peer() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_link_scores('[{"uuid":"GPU-a","score":{"GPU-b":"high"}}]', "hami.io/node-nvidia-score")
    assert info.value.part == "GPU-b='high'"
    assert "must be an integer" in str(info.value)


def test_non_string_value_is_refused_with_its_type() -> None:
    with pytest.raises(AnnotationError) as info:
        decode_pod_devices(None, "hami.io/vgpu-devices-allocated")  # type: ignore[arg-type]
    assert "expected a string, got NoneType" in str(info.value)


def test_long_offending_part_is_shortened_in_the_message_but_kept_whole() -> None:
    value = "x" * 500
    with pytest.raises(AnnotationError) as info:
        decode_handshake(value, "hami.io/node-handshake")
    assert info.value.part == value
    assert "x" * 117 + "..." in str(info.value)
    assert "x" * 121 not in str(info.value)


# --------------------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------------------

# Text the encodings carry verbatim: anything but their separators (and lone surrogates, which are not text).
_SAFE = st.characters(exclude_characters=",:;", exclude_categories=["Cs"])
ident = st.text(_SAFE, min_size=1, max_size=16)
optional_ident = st.text(_SAFE, max_size=12)
any_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
natural = st.integers(min_value=0, max_value=2**40)

json_scalar = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | any_text
json_value = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3),
    max_leaves=8,
)

devices = st.builds(
    Device,
    id=ident,
    index=natural,
    count=natural,
    devmem=natural,
    devcore=natural,
    type=optional_ident,
    numa=st.integers(min_value=-1, max_value=64),
    health=st.booleans(),
    mode=optional_ident,
    mig_profiles=st.lists(json_value, max_size=3).map(tuple),
    vendor=any_text,
    custom=st.dictionaries(any_text, json_value, max_size=3),
)
legacy_devices = st.builds(
    Device,
    id=ident,
    index=natural,
    count=natural,
    devmem=natural,
    devcore=natural,
    type=optional_ident,
    numa=st.integers(min_value=-1, max_value=64),
    health=st.booleans(),
    mode=optional_ident,
)
container_devices = st.builds(ContainerDevice, uuid=ident, type=ident, usedmem=natural, usedcores=natural)
placements = st.lists(st.lists(container_devices, max_size=3).map(tuple), max_size=5).map(tuple)
offsets = st.integers(min_value=-(23 * 60 + 59), max_value=23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
aware_seconds = st.datetimes(
    min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31), timezones=st.just(UTC) | offsets
).map(lambda t: t.replace(microsecond=0))
no_comma = st.text(st.characters(exclude_characters=",", exclude_categories=["Cs"]), max_size=12)
node_locks = st.builds(NodeLock, time=aware_seconds, namespace=no_comma, name=no_comma, uid=no_comma)
handshakes = st.builds(
    Handshake,
    state=st.sampled_from(["Requesting", "Reported", "Deleted"]),
    time=st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)).map(
        lambda t: t.replace(microsecond=0)
    ),
)
mig_reservations = st.builds(
    MigReservation,
    container_index=natural,
    device_index=natural,
    gpu_uuid=any_text.filter(bool),
    profile=any_text.filter(bool),
    start=natural,
    size=st.integers(min_value=1, max_value=2**31),
    mig_uuid=any_text,
    gpu_instance_id=st.none() | natural,
    compute_instance_id=st.none() | natural,
)
link_tables = st.dictionaries(any_text, st.dictionaries(any_text, st.integers(-(2**40), 2**40), max_size=4), max_size=4)


@ROUND_TRIP
@given(st.lists(devices, max_size=4))
def test_node_register_round_trips(items: list[Device]) -> None:
    assert decode_node_register(encode_node_register(items)) == items


@ROUND_TRIP
@given(st.lists(legacy_devices, max_size=4))
def test_legacy_register_nine_fields_round_trips(items: list[Device]) -> None:
    assert decode_legacy_register(encode_legacy_register(items, fields=9)) == items


@ROUND_TRIP
@given(st.lists(legacy_devices, max_size=4))
def test_legacy_register_seven_fields_round_trips_what_it_carries(items: list[Device]) -> None:
    decoded = decode_legacy_register(encode_legacy_register(items, fields=7))
    assert decoded == [d.model_copy(update={"index": 0, "mode": ""}) for d in items]


@ROUND_TRIP
@given(placements)
def test_pod_devices_round_trip(value: tuple[tuple[ContainerDevice, ...], ...]) -> None:
    assert decode_pod_devices(encode_pod_devices(value)) == value


@ROUND_TRIP
@given(node_locks)
def test_node_lock_round_trips(lock: NodeLock) -> None:
    decoded = decode_node_lock(encode_node_lock(lock))
    assert decoded == lock
    assert decoded.time.utcoffset() == lock.time.utcoffset()


@ROUND_TRIP
@given(handshakes)
def test_handshake_round_trips(handshake: Handshake) -> None:
    assert decode_handshake(encode_handshake(handshake)) == handshake


@ROUND_TRIP
@given(st.lists(mig_reservations, max_size=4))
def test_mig_allocations_round_trip(items: list[MigReservation]) -> None:
    assert decode_mig_allocations(encode_mig_allocations(items)) == items


@ROUND_TRIP
@given(link_tables)
def test_link_scores_round_trip(table: dict[str, dict[str, int]]) -> None:
    assert decode_link_scores(encode_link_scores(table)) == table


# --------------------------------------------------------------------------------------------------------
# Stability and fuzzing: every decoder returns a value or raises AnnotationError, whatever the input
# --------------------------------------------------------------------------------------------------------

KEY = "hami.io/fuzzed-annotation"

# decoder, the encoder that inverts it
CODECS: dict[str, tuple[Callable[[Any, str], Any], Callable[[Any], str]]] = {
    "node_register": (decode_node_register, encode_node_register),
    "legacy_register": (decode_legacy_register, encode_legacy_register),
    "pod_devices": (decode_pod_devices, encode_pod_devices),
    "node_lock": (decode_node_lock, encode_node_lock),
    "handshake": (decode_handshake, encode_handshake),
    "link_scores": (decode_link_scores, encode_link_scores),
    "mig_allocations": (decode_mig_allocations, encode_mig_allocations),
}

_JSON_ALPHABET = '[]{}",:0123456789-.eE truefalsnul\\idcountdevmemhalthgpuUIDsorepla'
_STRING_ALPHABET = ",:;0123456789-+ TZtrufalseGPU_Requstigdpo\n"

_JSON_WORDS = st.sampled_from(
    [
        "[",
        "]",
        "{",
        "}",
        ",",
        ":",
        '"id"',
        '"ID"',
        '"health"',
        '"count"',
        '"devmem"',
        '"uuid"',
        '"score"',
        '"gpuUUID"',
        '"profile"',
        '"placement"',
        '"start"',
        '"size"',
        '"containerIndex"',
        '"deviceIndex"',
        '"migProfiles"',
        '"custominfo"',
        '"GPU-0"',
        "true",
        "false",
        "null",
        "0",
        "-1",
        "1.5",
        "1e400",
        "NaN",
        '"\\u0000"',
        '"\\ud800"',
    ]
)
_STRING_WORDS = st.sampled_from(
    [
        ",",
        ":",
        ";",
        "GPU-A",
        "NVIDIA",
        "true",
        "false",
        "0",
        "-1",
        "+",
        "9" * 20,
        " ",
        "2025-01-02",
        "T",
        "03:04:05",
        "Z",
        "+08:00",
        "Requesting_",
        "Reported_",
        "2025-01-02 03:04:05",
        "\u0663",  # ARABIC-INDIC DIGIT THREE: a digit to str.isdigit, not to Go
    ]
)


def _nested(prefix: str, opening: str, closing: str) -> st.SearchStrategy[str]:
    """`prefix` then `opening` n times and `closing` m times: near and far past the recursion limit."""
    depth = st.integers(min_value=1, max_value=3_000) | st.integers(min_value=3_000, max_value=200_000)
    return st.tuples(depth, st.integers(min_value=0, max_value=3_000)).map(
        lambda nm: prefix + opening * nm[0] + closing * min(nm[0], nm[1])
    )


_KEYS = [
    *("id", "ID", "index", "count", "devmem", "Devmem", "devcore", "type", "numa", "health", "Health", "mode"),
    *("migProfiles", "migtemplate", "devicevendor", "custominfo", "uuid", "UUID", "score", "containerIndex"),
    *("deviceIndex", "gpuUUID", "profile", "placement", "migUUID", "gpuInstanceID", "computeInstanceID"),
    *("start", "size", "GPU-b"),
]
_small_json = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-2, max_value=10),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["GPU-0", "GPU-b", "NVIDIA-A100", "hami-core", "1g.5gb", "", "a:b"]),
)
_json_field = st.recursive(
    _small_json,
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=3),
    max_leaves=6,
)
# Well-formed values of every format, then the same with one character inserted or replaced: mostly near misses.
_valid_encodings = st.one_of(
    st.lists(devices, max_size=3).map(encode_node_register),
    st.lists(legacy_devices, max_size=3).map(encode_legacy_register),
    st.lists(legacy_devices, max_size=3).map(lambda items: encode_legacy_register(items, fields=7)),
    placements.map(encode_pod_devices),
    node_locks.map(encode_node_lock),
    handshakes.map(encode_handshake),
    link_tables.map(encode_link_scores),
    st.lists(mig_reservations, max_size=3).map(encode_mig_allocations),
)
_MUTATIONS = ["", ",", ":", ";", "[", "]", "{", "}", '"', "-", "0", "9", " ", "\\", "null", ".5", "T", "_", "Z"]


def _mutate(value: str, at: int, text: str, replace: bool) -> str:
    at %= len(value) + 1
    return value[:at] + text + value[at + replace :]


structured_texts = (
    _valid_encodings,
    st.builds(_mutate, _valid_encodings, st.integers(min_value=0), st.sampled_from(_MUTATIONS), st.booleans()),
    # JSON arrays of objects with the keys the formats use and values of every JSON type
    st.lists(st.dictionaries(st.sampled_from(_KEYS), _json_field, max_size=6), max_size=3).map(json.dumps),
    # legacy register entries with good and bad fields
    st.lists(
        st.lists(
            st.sampled_from(["DCU-1", "", "4", "-1", "+7", "x", "true", "false", "T", "hami-core"]), max_size=10
        ).map(",".join),
        max_size=4,
    ).map(lambda entries: ":".join(entries) + ":"),
    st.from_regex(r"\A((GPU-[A-Z],[A-Z]{0,6},[+-]?[0-9]{1,5},[0-9]{1,3}(,x)?:){0,3};){0,4}\Z"),
    st.from_regex(
        r"\A[0-9]{4}-(0[1-9]|1[0-3])-(0[1-9]|[12][0-9])[Tt ]([01][0-9]|2[0-4]):[0-5][0-9](:[0-6][0-9](\.[0-9]{1,9})?)?"
        r"([Zz]|[+-][01][0-9]:[0-5][0-9])?(,[a-z0-9-]{0,8}){0,4}\Z"
    ),
    st.from_regex(
        r"\A(Requesting|Reported|Deleted|Asking)_[0-9]{4}-(0?[1-9]|1[0-3])-(0?[1-9]|[12][0-9])"
        r" ([01]?[0-9]|2[0-4]):[0-6][0-9]:[0-6][0-9]\Z"
    ),
)
fuzz_text = st.one_of(
    st.text(max_size=60),
    st.text(st.sampled_from(_JSON_ALPHABET), max_size=60),
    st.text(st.sampled_from(_STRING_ALPHABET), max_size=60),
    st.lists(_JSON_WORDS, max_size=30).map("".join),
    st.lists(_STRING_WORDS, max_size=30).map("".join),
    _nested("", "[", "]"),
    _nested('[{"id":"x","custominfo":', "[", "]"),
    _nested('[{"uuid":"GPU-a","score":', '{"a":', "}"),
    _nested('[{"containerIndex":0,"placement":', "[", "]"),
    *structured_texts,
    st.from_regex(r"\A\[(\{\"[a-zA-Z]{1,12}\":(-?[0-9]{1,3}|\"[A-Za-z0-9-]{0,6}\"|true|null|\[\]|\{\})\},?){0,4}\]\Z"),
)
non_text = st.one_of(st.none(), st.integers(), st.binary(max_size=20), st.floats(), st.lists(st.integers(), max_size=3))


def _decode_or_annotation_error(decode: Callable[[Any, str], Any], value: Any) -> Any:
    """The decoder's value, or None when it raised AnnotationError naming KEY; any other exception fails."""
    try:
        return decode(value, KEY)
    except AnnotationError as err:
        error = err
    assert type(error) is AnnotationError
    assert error.annotation == KEY
    assert str(error).startswith(f"annotation {KEY}: ")
    assert isinstance(error.part, str)
    return None


@pytest.mark.parametrize("name", CODECS)
@FUZZ
@given(value=fuzz_text)
def test_decoder_returns_a_value_or_raises_annotation_error_for_any_text(name: str, value: str) -> None:
    _decode_or_annotation_error(CODECS[name][0], value)


@pytest.mark.parametrize("name", CODECS)
@settings(max_examples=30, deadline=None)
@given(value=non_text)
def test_decoder_refuses_non_string_values_with_annotation_error(name: str, value: Any) -> None:
    with pytest.raises(AnnotationError, match=KEY):
        CODECS[name][0](value, KEY)


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("depth", [10, 1_000, 100_000])
def test_deeply_nested_input_is_an_annotation_error_not_a_recursion_error(name: str, depth: int) -> None:
    for value in ["[" * depth, "[" * depth + "]" * depth, '[{"id":"x","custominfo":' + "{" * depth]:
        _decode_or_annotation_error(CODECS[name][0], value)


@pytest.mark.parametrize("name", CODECS)
@FUZZ
@given(value=fuzz_text)
def test_decode_encode_decode_is_stable(name: str, value: str) -> None:
    decode, encode = CODECS[name]
    first = _decode_or_annotation_error(decode, value)
    if first is None:
        return
    assert decode(encode(first), KEY) == first


def test_fuzz_corpus_reaches_successful_decodes() -> None:
    """Guard against fuzzers that only ever exercise the error path."""
    samples = {
        "node_register": '[{"id":"GPU-0","health":true}]',
        "legacy_register": "DCU-1,4,16384,100,Z100,0,true:",
        "pod_devices": ";GPU-A,NVIDIA,1,2:;",
        "node_lock": "2025-01-02T03:04:05Z,ns,pod",
        "handshake": "Requesting_2025-01-02 03:04:05",
        "link_scores": '[{"uuid":"GPU-a","score":{"GPU-b":1}}]',
        "mig_allocations": MIG_RESERVED,
    }
    for name, (decode, encode) in CODECS.items():
        value = decode(samples[name], KEY)
        assert decode(encode(value), KEY) == value
    assert json.loads(encode_node_register(decode_node_register(samples["node_register"])))[0]["health"] is True
