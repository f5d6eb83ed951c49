"""The replica checksum: equal bits give equal sums, any one flipped bit changes it, and the
setting's bad values are refused."""

from __future__ import annotations

import pytest

from phalanx.errors import ConfigError

torch = pytest.importorskip("torch")
from phalanx.torch._replicas import check_replica_setting, checksum  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_every_single_flipped_bit_changes_the_checksum(dtype):
    params = [torch.randn(3, 5).to(dtype), torch.randn(7).to(dtype)]
    base = checksum(params)
    assert checksum([p.clone() for p in params]) == base
    for which, param in enumerate(params):
        raw = param.view(-1).view(torch.uint8)
        for byte in range(raw.numel()):
            for bit in range(8):
                raw[byte] ^= 1 << bit
                assert checksum(params) != base, (which, byte, bit)
                raw[byte] ^= 1 << bit
    assert checksum(params) == base


def test_the_order_of_the_parameters_counts_and_a_slice_reads_its_own_bytes():
    a, b = torch.randn(4), torch.randn(4)
    assert checksum([a, b]) != checksum([b, a])
    whole = torch.randn(9)
    assert checksum([whole[1:5]]) == checksum([whole[1:5].clone()])


def test_the_setting():
    assert check_replica_setting(True) == 0 and check_replica_setting(50) == 50
    assert check_replica_setting(False) is None
    for bad in (0, -3, "yes", 1.5):
        with pytest.raises(ConfigError, match="HINT: replica_check=100"):
            check_replica_setting(bad)


def test_the_environment_turns_it_off(monkeypatch):
    monkeypatch.setenv("PHALANX_REPLICA_CHECK", "0")
    assert check_replica_setting(True) is None and check_replica_setting(10) is None
