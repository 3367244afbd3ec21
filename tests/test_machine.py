"""What a manifest records about the measuring machine: enough to tell two VMs apart that both
call their CPU "AMD EPYC" (they ran the same models 30% apart)."""

from __future__ import annotations

import sys

import pytest

from latpred.profile.machine import cpu_id, machine_fields


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/cpuinfo")
def test_cpu_id_names_family_model_stepping_and_caches():
    fields = {}
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    got = cpu_id()
    assert got.startswith(f"{fields['vendor_id']} family {fields['cpu family']} "
                          f"model {fields['model']} stepping {fields.get('stepping', '?')}")
    assert machine_fields()["cpu_id"] == got
