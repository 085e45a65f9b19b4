"""A driver killed or stopped by a signal leaves nothing behind (issue 20, item 2).

The RL tests run ``python -m verl.trainer.main_ppo`` in a child process with a custom
reward (so scoring runs in forked reward workers) that announces itself and then dawdles,
so the signal lands in the middle of step 2's scoring; another runs ``main_sft`` on two
FSDP2 ranks (Ray actors) and sends Ctrl-C's SIGINT to its process group (the driver in a
session of its own, as a shell's foreground job). These drivers are forked from one parent
that imported the trainers for the module (``tests/trainer/prewarmed.py``): each is a
process of its own that the signal reaches as it would a fresh interpreter, without that
interpreter's seconds of imports. The last runs upstream's ``torchrun -m
verl.trainer.fsdp_sft_trainer`` on two ranks (real interpreters: torchrun's own start) and
stops it with SIGTERM. Every process a driver starts inherits an environment variable
unique to the module's parent (which carries it too and is left out) or to the torchrun
test, which finds them even after they have been re-parented.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from verl.config import to_yaml
from verl.utils.distributed import find_free_port
from verl.utils.lifetime import kill_processes_with_env, processes_with_env, wait_until_gone

from .prewarmed import Child, Prewarmed

pytestmark = pytest.mark.slow

MARK = "VERL_DRIVER_SIGNAL_TEST"
# One OpenMP thread per child driver, as in the pytest process (tests/conftest.py): two stall
# on two cores shared with the other xdist worker.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
PREWARM = (
    "verl.trainer.main_ppo",
    "verl.trainer.rl.trainer",
    "verl.workers",
    "verl.trainer.main_sft",
    "verl.trainer.offline.launch",
)

REWARD = """
import os, time
from pathlib import Path

def slow(data_source, solution_str, ground_truth, extra_info=None):
    calls = Path(os.environ["REWARD_CALLS_DIR"])
    (calls / f"{os.getpid()}-{time.monotonic_ns()}").touch()
    if len(list(calls.iterdir())) > 8:  # step 1 is 8 calls; from step 2 on, dawdle
        time.sleep(0.5)
    return float(len(solution_str) % 2)
"""


class Drivers:
    """The module's prewarmed parent: ``start`` forks a ``main_ppo`` driver (``parent.start``
    any other); every process a driver starts carries ``mark``, as the parent (``pid``)
    does."""

    def __init__(self, parent: Prewarmed, mark: str, env: dict[str, str]) -> None:
        self.parent, self.pid, self.mark, self.env = parent, parent.pid, mark, env

    def start(self, cfg, tmp_path: Path, calls: Path) -> Child:
        config_file = tmp_path / "run.yaml"
        config_file.write_text(to_yaml(cfg))
        return self.parent.start(
            ["-m", "verl.trainer.main_ppo", "--config", config_file],
            cwd=tmp_path,
            stderr=tmp_path / "driver.err",
            env={**self.env, "REWARD_CALLS_DIR": str(calls)},
        )


@pytest.fixture(scope="module")
def drivers(tmp_path_factory) -> Iterator[Drivers]:
    mark = uuid.uuid4().hex
    env = {**os.environ, **ONE_THREAD, MARK: mark}
    cwd = tmp_path_factory.mktemp("drivers")
    with Prewarmed(PREWARM, env, cwd) as parent:
        yield Drivers(parent, mark, env)


def _stderr(child) -> str:
    if isinstance(child, Child):
        return child.stderr_bytes().decode()
    return child.stderr.read().decode()


def _start(drivers: Drivers, rl_config, tmp_path: Path, *extra: str) -> tuple[Child, Path]:
    (tmp_path / "reward.py").write_text(REWARD)
    calls = tmp_path / "calls"
    calls.mkdir()
    cfg = rl_config(
        f"custom_reward_function.path={tmp_path / 'reward.py'}",
        "custom_reward_function.name=slow",
        "trainer.total_training_steps=4",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        *extra,
    )
    child = drivers.start(cfg, tmp_path, calls)
    deadline = time.monotonic() + 180
    while len(list(calls.iterdir())) <= 9:  # inside step 2's scoring
        if child.poll() is not None:
            pytest.fail(f"the run ended early: {_stderr(child)[-3000:]}")
        assert time.monotonic() < deadline, "the run never reached step 2"
        time.sleep(0.1)
    return child, calls


@contextlib.contextmanager
def _reaped(child: subprocess.Popen | Child, mark: str, keep: int = 0) -> Iterator[None]:
    """Whatever the test asserts, the child and every process it started end with it (all
    that carry ``mark`` but the prewarmed parent ``keep``)."""
    try:
        yield
    finally:
        child.kill()
        child.wait()
        if keep:
            for pid in _marked(mark, keep):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        else:
            kill_processes_with_env(MARK, mark)


def _marked(mark: str, keep: int) -> dict[int, str]:
    return {pid: cmd for pid, cmd in processes_with_env(MARK, mark).items() if pid != keep}


def _wait_for_step_2(child: subprocess.Popen, metrics: Path, timeout_s: float) -> None:
    """Until the run's ``metrics.jsonl`` has two rows (steps 1 and 2 logged)."""
    deadline = time.monotonic() + timeout_s
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        if child.poll() is not None:
            pytest.fail(f"the run ended early: {_stderr(child)[-3000:]}")
        assert time.monotonic() < deadline, "the run never logged step 2"
        time.sleep(0.1)


def _assert_all_gone(mark: str, after: str, keep: int = 0) -> None:
    if keep:
        deadline = time.monotonic() + 10.0
        while (left := _marked(mark, keep)) and time.monotonic() < deadline:
            time.sleep(0.2)
    else:
        left = wait_until_gone(MARK, mark, 10.0)
    assert not left, f"still alive 10 s after {after}: {left}"


def test_sigkill_of_the_driver_takes_its_reward_workers_along(drivers, rl_config, tmp_path):
    child, _ = _start(drivers, rl_config, tmp_path)
    with _reaped(child, drivers.mark, drivers.pid):
        started = _marked(drivers.mark, drivers.pid)
        workers = [pid for pid in started if pid != child.pid]
        assert workers, f"expected reward worker processes beside the driver: {started}"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
        _assert_all_gone(drivers.mark, "the driver's SIGKILL", drivers.pid)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_sigint_stops_after_the_step_with_a_checkpoint(
    drivers, rl_config, tmp_path, sig
):
    child, _ = _start(drivers, rl_config, tmp_path, "trainer.save_freq=100")
    with _reaped(child, drivers.mark, drivers.pid):
        os.kill(child.pid, sig)
        _, stderr = child.communicate(timeout=120)
        stderr = stderr.decode()
        assert child.returncode == 128 + sig, stderr[-3000:]
        assert f"run stopped by {signal.Signals(sig).name} after step 2" in stderr
        # save_freq=100 would not have saved at step 2: this is the stop's own checkpoint.
        assert (tmp_path / "global_step_2" / "checkpoint.json").is_file()
        assert not (tmp_path / "huggingface").exists()  # no export of a stopped run
        _assert_all_gone(drivers.mark, "the run stopped", drivers.pid)


def test_sigterm_during_validation_stops_before_the_next_step_with_a_checkpoint(
    drivers, rl_config, tmp_path
):
    """Validation after step 2 (4 batches of one prompt, each scored for >= 0.5 s): SIGTERM
    in its second batch ends the run at the next batch, with step 2's checkpoint and no
    step 3 (it used to finish the validation and train one more step first)."""
    child, calls = _start(
        drivers,
        rl_config,
        tmp_path,
        "trainer.save_freq=100",
        "trainer.test_freq=2",
        "data.val_batch_size=1",
    )
    with _reaped(child, drivers.mark, drivers.pid):
        # steps 1 and 2 make 16 scoring calls, validation one per batch
        deadline = time.monotonic() + 120
        while len(list(calls.iterdir())) < 18:  # validation's second batch is scoring
            assert child.poll() is None, _stderr(child)[-3000:]
            assert time.monotonic() < deadline, "the run never reached validation"
            time.sleep(0.05)
        sent = time.monotonic()
        os.kill(child.pid, signal.SIGTERM)
        _, stderr = child.communicate(timeout=120)
        stopped_in = time.monotonic() - sent
        stderr = stderr.decode()
        assert child.returncode == 143, stderr[-3000:]
        assert "run stopped by SIGTERM after step 2" in stderr
        assert "step 2: validation stopped, not recorded" in stderr
        assert len(list(calls.iterdir())) < 20  # batches 3 and 4 were never scored
        assert (tmp_path / "global_step_2" / "checkpoint.json").is_file()
        assert not (tmp_path / "global_step_3").exists()
        rows = (tmp_path / "metrics.jsonl").read_text().splitlines()
        assert len(rows) == 2 and not any('"val/' in row for row in rows)
        assert not (tmp_path / "huggingface").exists()
        assert stopped_in < 60, stopped_in
        _assert_all_gone(drivers.mark, "the run stopped", drivers.pid)


def test_sigterm_during_validation_before_training_stops_with_nothing_trained(
    drivers, rl_config, tmp_path
):
    """val_before_train: SIGTERM in its second batch ends the run before step 1."""
    (tmp_path / "reward.py").write_text(REWARD.replace("> 8", "> 0"))  # every call dawdles
    calls = tmp_path / "calls"
    calls.mkdir()
    cfg = rl_config(
        f"custom_reward_function.path={tmp_path / 'reward.py'}",
        "custom_reward_function.name=slow",
        "trainer.val_before_train=true",
        "data.val_batch_size=1",
        "trainer.save_freq=1",
    )
    child = drivers.start(cfg, tmp_path, calls)
    with _reaped(child, drivers.mark, drivers.pid):
        deadline = time.monotonic() + 120
        while len(list(calls.iterdir())) < 2:
            assert child.poll() is None, _stderr(child)[-3000:]
            assert time.monotonic() < deadline, "the run never reached validation"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGTERM)
        _, stderr = child.communicate(timeout=120)
        stderr = stderr.decode()
        assert child.returncode == 143, stderr[-3000:]
        assert "run stopped by SIGTERM during the validation at step 0; no checkpoint" in stderr
        assert len(list(calls.iterdir())) < 4  # the validation's last batches never scored
        assert not list(tmp_path.glob("global_step_*"))
        assert (
            not (tmp_path / "metrics.jsonl").exists()
            or not (tmp_path / "metrics.jsonl").read_text().strip()
        )
        _assert_all_gone(drivers.mark, "the run stopped", drivers.pid)


def test_ctrl_c_stops_a_two_rank_sft_run_after_the_step(drivers, tiny_model_dir, tmp_path):
    """SIGINT to the whole process group of ``main_sft`` on two FSDP2 ranks, as a terminal's
    Ctrl-C sends it: the ranks finish the step under way, save, and the driver exits 130."""
    from verl.config import load_sft_config

    cfg = load_sft_config(
        overrides=[
            f"model.path={tiny_model_dir}",
            "data.arithmetic.train_size=64",
            "data.train_batch_size=4",
            "data.micro_batch_size_per_device=2",
            "trainer.total_training_steps=400",  # far more than the test waits for
            "trainer.save_freq=1000",  # only the stop saves
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "trainer.logger=[jsonl]",
            "trainer.device=cpu",
            "trainer.n_gpus_per_node=2",
            "engine.strategy=fsdp2",
            "trainer.num_threads=1",
            f"trainer.default_local_dir={tmp_path}",
            f"trainer.log_dir={tmp_path}",
        ]
    )
    config_file = tmp_path / "sft.yaml"
    config_file.write_text(to_yaml(cfg))
    child = drivers.parent.start(
        ["-m", "verl.trainer.main_sft", "--config", config_file],
        cwd=tmp_path,
        stderr=tmp_path / "driver.err",
        env=drivers.env,
        start_new_session=True,  # its own process group, as a shell gives a foreground job
    )
    with _reaped(child, drivers.mark, drivers.pid):
        _wait_for_step_2(child, tmp_path / "metrics.jsonl", 300)
        os.killpg(child.pid, signal.SIGINT)
        _, stderr = child.communicate(timeout=120)
        stderr = stderr.decode()
        assert child.returncode == 130, stderr[-3000:]
        stopped = re.search(r"run stopped by SIGINT after step (\d+); checkpoint: (\S+)", stderr)
        assert stopped, stderr[-3000:]
        step = int(stopped.group(1))
        assert 2 <= step < 400
        assert Path(stopped.group(2)) == tmp_path / f"global_step_{step}"
        assert (tmp_path / f"global_step_{step}" / "checkpoint.json").is_file()
        assert not (tmp_path / "huggingface").exists()
        _assert_all_gone(drivers.mark, "the run stopped", drivers.pid)


def test_torchrun_runs_upstreams_sft_entry_point_on_two_ranks(tiny_model_dir, tmp_path):
    """``torchrun --nproc_per_node=2 -m verl.trainer.fsdp_sft_trainer`` with upstream's keys:
    two FSDP2 ranks in torchrun's process group (no Ray), a two-rank checkpoint, the export;
    then SIGTERM to torchrun mid-run stops both ranks after the same step, with its
    checkpoint."""
    from verl.trainer.lifecycle.checkpoint import read_manifest

    def launch(run_dir: Path, steps: int) -> subprocess.Popen:
        args = [
            f"model.partial_pretrain={tiny_model_dir}",
            "data.arithmetic.train_size=64",
            "data.train_batch_size=4",
            "data.micro_batch_size_per_gpu=2",
            f"trainer.total_training_steps={steps}",
            "trainer.save_freq=1000",
            "trainer.logger=[jsonl]",
            "trainer.device=cpu",
            "trainer.num_threads=1",
            "ulysses_sequence_parallel_size=1",
            f"trainer.default_local_dir={run_dir}",
            f"trainer.log_dir={run_dir}",
        ]
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
        torchrun += [f"--master_port={find_free_port()}", "--master_addr=127.0.0.1"]
        # torchrun's own logs under the test's directory (by default a /tmp directory it
        # never removes)
        torchrun += [f"--log-dir={run_dir}-torchrun-logs"]
        return subprocess.Popen(
            [*torchrun, "-m", "verl.trainer.fsdp_sft_trainer", *args],
            env={**os.environ, **ONE_THREAD, MARK: mark},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
        )

    mark = uuid.uuid4().hex
    done = launch(tmp_path / "done", 2)
    with _reaped(done, mark):
        _, stderr = done.communicate(timeout=240)
        assert done.returncode == 0, stderr.decode()[-3000:]
    manifest = read_manifest(tmp_path / "done" / "global_step_2", verify=True)
    assert manifest["roles"]["actor_rollout_ref"]["world_size"] == 2
    assert manifest["roles"]["actor_rollout_ref"]["strategy"] == "fsdp2"
    assert (tmp_path / "done" / "huggingface" / "model.safetensors").is_file()

    run_dir = tmp_path / "stopped"
    child = launch(run_dir, 400)
    with _reaped(child, mark):
        _wait_for_step_2(child, run_dir / "metrics.jsonl", 240)
        child.send_signal(signal.SIGTERM)  # torchrun passes it on to both ranks
        _, stderr = child.communicate(timeout=120)
        stderr = stderr.decode()
        stopped = re.findall(r"run stopped by SIGTERM after step (\d+); checkpoint: (\S+)", stderr)
        assert len(stopped) == 2 and stopped[0] == stopped[1], stderr[-3000:]
        step = int(stopped[0][0])
        assert Path(stopped[0][1]) == run_dir / f"global_step_{step}"
        read_manifest(run_dir / f"global_step_{step}", verify=True)
        _assert_all_gone(mark, "the run stopped")
