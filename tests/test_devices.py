"""The device a job got against the GPU type its cells are measured as (issue 52): checked on device properties as
the NVIDIA driver reports them (torch.cuda.get_device_properties: the name, the total memory), so without a GPU;
on a GPU the cell's own check runs on device 0 (skipped on CPU)."""

from __future__ import annotations

import pytest
from pretrain_planner.planning.devices import detect_type, device_mismatch, names

from .conftest import CATALOG

MIB = 1024**2
# name and total memory (MiB) as the driver reports them, for each part these tests look at
A100_40 = ("NVIDIA A100-SXM4-40GB", 40960 * MIB)
A100_80 = ("NVIDIA A100-SXM4-80GB", 81920 * MIB)
H100 = ("NVIDIA H100 80GB HBM3", 81559 * MIB)
H200 = ("NVIDIA H200", 143771 * MIB)
L40S = ("NVIDIA L40S", 46068 * MIB)
RTX3090 = ("NVIDIA GeForce RTX 3090", 24576 * MIB)


def test_an_a100_40gb_in_a_partition_mapped_to_the_80gb_a100_is_named():
    why = device_mismatch(CATALOG.gpus["a100"], *A100_40, CATALOG.gpus.values())
    assert why is not None
    assert "NVIDIA A100-SXM4-40GB (40.0 GiB), not GPU type a100" in why and "where a100 has 80 GiB" in why
    assert "of its own in the site file" in why and "measure these nodes as a100-40gb" in why
    assert "its name does not name" not in why  # the model is right, its memory is not


@pytest.mark.parametrize(("device", "gpu"), [(A100_80, "a100"), (A100_40, "a100-40gb"), (H100, "h100"),
                                             (H200, "h200"), (L40S, "l40s"), (RTX3090, "rtx3090")])  # fmt: skip
def test_the_right_device_passes_and_is_the_type_detected(device, gpu):
    assert device_mismatch(CATALOG.gpus[gpu], *device) is None
    assert detect_type(CATALOG.gpus.values(), *device) == gpu


def test_another_model_with_as_much_memory_is_named_by_its_name():
    why = device_mismatch(CATALOG.gpus["h100"], *A100_80, CATALOG.gpus.values())
    assert why and "its name does not name 'h100'" in why and "measure these nodes as a100" in why


@pytest.mark.parametrize(("gpu", "device"), [("a10", A100_80[0]), ("l40", L40S[0]), ("h200", "NVIDIA GH200 480GB")])
def test_a_model_is_named_as_a_whole_word(gpu, device):
    assert not names(CATALOG.gpus[gpu], device)


def test_a_device_the_catalog_lacks_asks_for_its_entry():
    why = device_mismatch(CATALOG.gpus["h100"], "NVIDIA Quadro RTX 8000", 49152 * MIB, CATALOG.gpus.values())
    assert why and why.endswith("add its type to config/gpus.yaml")
    assert detect_type(CATALOG.gpus.values(), "NVIDIA Quadro RTX 8000", 49152 * MIB) is None


def test_a_cell_on_a_gpu_checks_its_device():
    """GPU path (skipped on CPU): device 0 passes as its detected type and is refused as another."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from pretrain_planner.trainer.run import check_device

    props = torch.cuda.get_device_properties(0)
    mine = detect_type(CATALOG.gpus.values(), props.name, props.total_memory)
    assert mine is not None, (props.name, props.total_memory)
    check_device(CATALOG.gpus[mine].to_dict(), torch.device("cuda", 0))
    other = "rtx3090" if mine != "rtx3090" else "h100"
    with pytest.raises(RuntimeError, match=f"not GPU type {other}"):
        check_device(CATALOG.gpus[other].to_dict(), torch.device("cuda", 0))
