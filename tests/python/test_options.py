# SPDX-License-Identifier: MIT
"""Manager(**options) passes each option to the library's own table
(dormant_options_set): names and values are checked there, and Python keeps
no copy of the option list."""
import pytest

import dormant
from dormant import _library

MiB = 1 << 20


def test_the_list_comes_from_the_library():
    names = [o["name"] for o in dormant.options()]
    for name in ("backend", "host_mode", "chunk_bytes", "guard_timeout_ms", "copy_threads",
                 "staging_bytes", "pin_host", "pin_piece_bytes", "host_devices",
                 "host_device_bytes"):
        assert name in names
    by_name = {o["name"]: o for o in dormant.options()}
    assert by_name["chunk_bytes"]["env"] == "DORMANT_CHUNK_BYTES"
    assert by_name["chunk_bytes"]["type"] == "size"
    assert by_name["backend"]["values"] == ["auto", "cuda", "host"]
    assert by_name["guard_timeout_ms"]["env"] is None
    assert all(o["doc"] for o in dormant.options())
    # no hand-made mirror of struct dormant_options is left
    assert not hasattr(_library, "Options")


def test_the_keywords_of_before_still_work():
    with dormant.Manager(backend="host", host_mode="retain", chunk_bytes=4 * MiB,
                         guard_timeout_ms=0, copy_threads=2, staging_bytes=8 * MiB,
                         host_devices=2, host_device_bytes=64 * MiB) as m:
        assert m.host_mode == "retain"
        assert m.option("chunk_bytes") == str(4 * MiB)
        assert m.option("guard_timeout_ms") == "30000"  # 0 meant the default, and still does
        assert m.option("copy_threads") == "2"
        assert m.option("host_devices") == "2"
        assert m.option("host_device_bytes") == str(64 * MiB)
    # and 0 for the others too: the defaults
    with dormant.Manager(backend="host", chunk_bytes=0, copy_threads=0, staging_bytes=0,
                         host_devices=0, host_device_bytes=0, host_mode=None) as m:
        assert m.option("chunk_bytes") == str(1 << 30)
        assert m.option("staging_bytes") == str(256 * MiB)
        assert m.option("host_devices") == "1"


def test_text_bool_and_newer_options():
    with dormant.Manager(backend="host", chunk_bytes="2MiB", pin_host=False,
                         pin_piece_bytes="1MiB", guard_timeout_ms="0") as m:
        assert m.option("chunk_bytes") == str(2 * MiB)
        assert m.option("pin_host") == "false"
        assert m.option("pin_piece_bytes") == str(MiB)
        assert m.option("guard_timeout_ms") == "0"  # as text: "do not wait"


def test_every_listed_option_is_taken():
    for o in dormant.options():
        value, reads = {"bool": (True, "true"), "size": ("8MiB", str(8 * MiB)),
                        "int": (1, "1"), "path": ("/var/tmp", "/var/tmp")}.get(o["type"],
                                                                             (None, None))
        if o["type"] == "enum":
            value = reads = "host" if o["name"] == "backend" else o["values"][-1]
        assert value is not None, f"a type this test does not know: {o}"
        with dormant.Manager(**{"backend": "host", o["name"]: value}) as m:
            assert m.option(o["name"]) == reads


def test_environment_applies_when_not_given(monkeypatch):
    monkeypatch.setenv("DORMANT_CHUNK_BYTES", "8MiB")
    with dormant.Manager(backend="host") as m:
        assert m.option("chunk_bytes") == str(8 * MiB)
    with dormant.Manager(backend="host", chunk_bytes=2 * MiB) as m:
        assert m.option("chunk_bytes") == str(2 * MiB)


@pytest.mark.parametrize("options, words", [
    ({"chunk_size": 4096}, ["chunk_size", "chunk_bytes"]),      # unknown: the list is given
    ({"copy_threads": 999}, ["copy_threads", "999"]),
    ({"host_mode": "sometimes"}, ["host_mode", "sometimes"]),
    ({"chunk_bytes": "12XB"}, ["chunk_bytes", "12XB"]),
    ({"pin_host": "maybe"}, ["pin_host", "maybe"]),
    ({"chunk_bytes": 1.5}, ["chunk_bytes", "float"]),
])
def test_bad_names_and_values_raise_naming_them(options, words):
    with pytest.raises(dormant.InvalidArgumentError) as caught:
        dormant.Manager(backend="host", **options)
    assert isinstance(caught.value, ValueError)
    for word in words:
        assert word in str(caught.value)


def test_option_of_an_unknown_name_raises(mgr):
    with pytest.raises(dormant.InvalidArgumentError):
        mgr.option("nope")
