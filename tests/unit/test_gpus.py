"""The node's GPUs shared out among the shards that run on it at once (workers.gpus): where the list comes
from, and which GPUs each shard is given."""

from __future__ import annotations

import stat
import threading

import pytest

from workers import gpus
from workers.gpus import GpuPool, node_gpus


def test_the_node_list_comes_from_upwell_gpus_then_the_agents_own_cuda_visible_devices():
    assert node_gpus({"UPWELL_GPUS": "0,1, 2,3", "CUDA_VISIBLE_DEVICES": "5"}) == ["0", "1", "2", "3"]
    assert node_gpus({"UPWELL_GPUS": "none", "CUDA_VISIBLE_DEVICES": "5"}) == []
    # Slurm's allocation (or a container runtime's list) is kept as it names the GPUs: a subset stays valid
    assert node_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert node_gpus({"CUDA_VISIBLE_DEVICES": "GPU-8f1c,GPU-22ab"}) == ["GPU-8f1c", "GPU-22ab"]
    assert node_gpus({"CUDA_VISIBLE_DEVICES": ""}) == [] and node_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []


def _fake_smi(folder, modes: str, listing: str = "", knows_mig: bool = True):
    """An ``nvidia-smi`` that answers the queries ``node_gpus`` makes (``modes``: the query's lines, ``listing``:
    ``-L``'s), and refuses anything else (exit 9); ``knows_mig`` False: a driver older than MIG, which refuses
    the ``mig.mode.current`` field (``modes`` then holds the plain index query's lines)."""
    smi = folder / "nvidia-smi"
    mig_query = '[ "$1 $2" = "--query-gpu=index,mig.mode.current --format=csv,noheader" ]'
    smi.write_text("#!/bin/sh\n"
                   + (f"if {mig_query}; then printf '{modes}'; exit 0; fi\n" if knows_mig else
                      f"if {mig_query}; then echo 'Field \"mig.mode.current\" is not a valid field' >&2; exit 2; fi\n")
                   + "if [ \"$1 $2\" = \"--query-gpu=index --format=csv,noheader\" ]; then "
                   + f"printf '{modes}'; exit 0; fi\n"
                   + f"if [ \"$1\" = -L ]; then printf '{listing}'; exit 0; fi\nexit 9\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)


def test_otherwise_nvidia_smi_lists_them_and_a_node_without_it_has_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert node_gpus({}) == []  # no nvidia-smi on PATH
    _fake_smi(tmp_path, "0, Disabled\\n1, Disabled\\n2, [N/A]\\n")
    assert node_gpus({}) == ["0", "1", "2"]
    _fake_smi(tmp_path, "0\\n1\\n", knows_mig=False)  # an older driver: its GPUs by index all the same
    assert node_gpus({}) == ["0", "1"]
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")  # no driver
    assert node_gpus({}) == []


# nvidia-smi -L on a node whose GPU 0 is in MIG mode with two instances, GPU 1 whole, GPU 2 in MIG mode with none
MIG_LISTING = ("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-9c73eb7b-8d6d-6c0e-dc13-97873e2ede40)\n"
               "  MIG 3g.40gb     Device  0: (UUID: MIG-a686709d-6dc2-542a-8851-0d2508448c10)\n"
               "  MIG 3g.40gb     Device  1: (UUID: MIG-53864714-0a66-5df2-9007-9268e30d9a72)\n"
               "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-c92e2d5d-4a69-f1cd-4df0-305f8606705a)\n"
               "GPU 2: NVIDIA A100-SXM4-80GB (UUID: GPU-d5a46a2e-1d77-575d-99e3-1f96c8555a2e)\n")


def test_a_gpu_in_mig_mode_counts_as_its_instances_by_uuid(tmp_path, monkeypatch):
    """CUDA cannot use a GPU in MIG mode by its index, only its instances by UUID: each slot gets an instance
    of its own, and a GPU in MIG mode with no instance made gives none."""
    assert gpus.mig_instances(MIG_LISTING) == {"0": ["MIG-a686709d-6dc2-542a-8851-0d2508448c10",
                                                     "MIG-53864714-0a66-5df2-9007-9268e30d9a72"]}
    monkeypatch.setenv("PATH", str(tmp_path))
    _fake_smi(tmp_path, "0, Enabled\\n1, Disabled\\n2, Enabled\\n", MIG_LISTING.replace("\n", "\\n"))
    ids = node_gpus({})
    assert ids == ["MIG-a686709d-6dc2-542a-8851-0d2508448c10", "MIG-53864714-0a66-5df2-9007-9268e30d9a72", "1"]
    pool = GpuPool(ids)
    with pool.lease(1) as a, pool.lease(1) as b:
        assert gpus.visible({}, a)["CUDA_VISIBLE_DEVICES"] == ids[0] and b == [ids[1]]


def test_each_slot_gets_gpus_of_its_own_and_gives_them_back():
    pool = GpuPool(["0", "1", "2", "3"])
    with pool.lease(1) as a, pool.lease(1) as b, pool.lease(2) as c:
        assert (a, b, c) == (["0"], ["1"], ["2", "3"])
        with pool.lease(1) as d:  # more shards than GPUs: the least held is shared, never a failure
            assert d == ["0"] and pool.held == {"0": 2, "1": 1, "2": 1, "3": 1}
    assert pool.held == dict.fromkeys("0123", 0)
    with pytest.raises(RuntimeError), pool.lease(3) as e:
        assert e == ["0", "1", "2"]
        raise RuntimeError("the payload's launch failed")
    assert pool.held == dict.fromkeys("0123", 0)  # given back all the same
    with pool.lease(8) as f:  # asked for more than the node has: all of them
        assert f == ["0", "1", "2", "3"]


def test_a_shard_that_asks_for_none_or_a_node_without_gpus_leaves_the_environment_alone():
    for pool, wanted in ((GpuPool(["0", "1"]), 0), (GpuPool([]), 1)):
        with pool.lease(wanted) as chosen:
            assert chosen is None
            env = {"CUDA_VISIBLE_DEVICES": "7", "PATH": "/bin"}
            assert gpus.visible(dict(env), chosen) == env
    # nvidia-smi's numbers are PCI bus order; CUDA's are that order only when asked (a node's own choice kept)
    assert gpus.visible({"PATH": "/bin"}, ["1", "3"]) == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1,3",
                                                          "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert gpus.visible({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, ["0"])["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


def test_slots_leasing_at_once_from_their_threads_never_share_while_gpus_are_free():
    pool, seen, lock = GpuPool([str(i) for i in range(8)]), [], threading.Lock()
    barrier = threading.Barrier(8)

    def slot() -> None:
        with pool.lease(1) as mine:
            with lock:
                seen.append(mine[0])
            barrier.wait(10)  # all eight hold theirs at once

    threads = [threading.Thread(target=slot) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(seen) == [str(i) for i in range(8)] and pool.held == {str(i): 0 for i in range(8)}
