"""The distillation teacher on a pool of its own (``algorithm.distill.teacher_pool=separate``,
:mod:`verl.trainer.rl.distill_pool`, :mod:`verl.workers.teacher_worker`): the split passes
give the colocated teacher's scores exactly, two training steps give its losses and weights
(local backend; the Ray run places the teacher on a device of its own), the teacher holds no
optimizer and gets no gradient, and the keys that do not fit are refused by name."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from verl.config import ConfigError, load_config
from verl.config.device_map import DataParallelConfig, resolve_device_map
from verl.models.tiny import build_tiny_tokenizer, save_tiny_model_dir
from verl.protocol import DataProto
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.distill_pool import SeparateTeacher
from verl.trainer.rl.trainer import RLTrainer
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.specs import actor_rollout_ref_spec, teacher_pool_spec
from verl.workers.teacher_worker import TeacherWorker

D = "algorithm.distill"
SEPARATE = (f"{D}.teacher_pool=separate",)
TOL = 1e-6
COMPARED = ("actor/distill_loss", "actor/distill_k1", "actor/pg_loss", "actor/grad_norm")


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A teacher with the student's tokenizer, another width and other (random) weights."""
    return save_tiny_model_dir(
        tmp_path_factory.mktemp("teacher") / "model", arch="qwen2", seed=3, hidden_size=96
    )


def _distill(teacher_dir, estimator: str) -> tuple[str, ...]:
    return (
        f"{D}.enable=true",
        f"{D}.teacher_path={teacher_dir}",
        f"{D}.estimator={estimator}",
        f"{D}.topk=4",
        "trainer.device=cpu",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
    )


# ---------------------------------------------------------------- the config


def _problems(rl_config, *overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        rl_config(*overrides)
    return str(err.value)


def test_separate_pool_is_a_placed_group(rl_config, teacher_dir):
    colocated = rl_config(*_distill(teacher_dir, "k1"))
    assert colocated.placed_roles == ["actor_rollout_ref"]
    cfg = rl_config(*_distill(teacher_dir, "k1"), *SEPARATE)
    assert cfg.placed_roles == ["actor_rollout_ref", "teacher"]
    # teacher_devices null: the actor's devices, one pool, one process
    assert cfg.device_map.roles == {"actor_rollout_ref": "global_pool", "teacher": "global_pool"}
    assert cfg.worker_backend == "local"
    apart = resolve_device_map(
        DataParallelConfig(actor_devices=[0, 1], teacher_devices=[2, 3]), 1, 4
    )
    assert apart.pools == {"actor_rollout_ref_pool": (0, 1), "teacher_pool": (2, 3)}


def test_teacher_pool_without_distillation_is_refused(rl_config):
    message = _problems(rl_config, *SEPARATE)
    assert "algorithm.distill.teacher_pool=separate without algorithm.distill.enable" in message


def test_teacher_devices_without_a_separate_pool_are_refused(rl_config, teacher_dir):
    devices = ("trainer.n_gpus_per_node=2", "resource_pool.teacher_devices=[1]")
    message = _problems(rl_config, *_distill(teacher_dir, "k1"), *devices)
    assert "resource_pool.teacher_devices=[1] places the distillation teacher" in message
    assert "algorithm.distill.teacher_pool=separate (now enable=true, teacher_pool=colocated)" in (
        message
    )


def test_teacher_devices_partly_overlapping_the_actors_are_refused(rl_config, teacher_dir):
    message = _problems(
        rl_config,
        *_distill(teacher_dir, "k1"),
        *SEPARATE,
        "trainer.n_gpus_per_node=3",
        "trainer.backend=ray",
        "resource_pool.actor_devices=[0,1]",
        "resource_pool.teacher_devices=[1,2]",
    )
    assert "resource_pool.teacher_devices=[1, 2] partly overlaps resource_pool.actor_devices" in (
        message
    )


def test_local_backend_refuses_a_teacher_on_other_devices(rl_config, teacher_dir):
    message = _problems(
        rl_config,
        *_distill(teacher_dir, "k1"),
        *SEPARATE,
        "trainer.n_gpus_per_node=2",
        "trainer.backend=local",
        "resource_pool.actor_devices=[0]",
        "resource_pool.teacher_devices=[1]",
    )
    assert "trainer.backend=local runs every role in this one process" in message
    assert "teacher on devices [1]" in message


# ---------------------------------------------------------------- the workers

P, R = 6, 5
PROMPT_LENS = [6, 2, 4, 3, 5, 1]
RESPONSE_LENS = [5, 3, 1, 2, 4, 2]


def _batch() -> DataProto:
    gen = torch.Generator().manual_seed(5)
    rows = len(PROMPT_LENS)
    ids = torch.randint(3, 200, (rows, P + R), generator=gen)
    mask = torch.zeros(rows, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True)):
        mask[i, P - p : P + r] = 1
    tensors = {
        "input_ids": ids * mask,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
        "response_mask": mask[:, P:].float(),
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 0.8})


class _Group:
    """A one-rank stand-in for a worker group: calls and ``.submit`` futures."""

    def __init__(self, worker):
        self.worker = worker

    def __getattr__(self, name):
        method = getattr(self.worker, name)

        class _Call:
            def __call__(self, *args):
                return method(*args)

            def submit(self, *args):
                value = method(*args)
                return type("F", (), {"result": lambda self: value})()

        return _Call()


def _workers(tiny_model_dir, teacher_dir, estimator, separate, precision="none"):
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"trainer.mixed_precision={precision}",
            "data.train_batch_size=3",
            f"data.max_prompt_length={P}",
            f"data.max_response_length={R}",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=3",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
            f"{D}.log_prob_micro_batch_size_per_device=4",
            *_distill(teacher_dir, estimator),
            *(SEPARATE if separate else ()),
        ]
    )
    torch.manual_seed(0)
    tokenizer = build_tiny_tokenizer()
    actor = ActorRolloutRefWorker(
        actor_rollout_ref_spec(cfg, role="actor_rollout"), tokenizer=tokenizer
    )
    actor.init_model(total_steps=4)
    if not separate:
        return actor, None
    teacher = TeacherWorker(teacher_pool_spec(cfg), tokenizer=tokenizer)
    teacher.init_model()
    return actor, teacher


@pytest.mark.parametrize(
    "estimator, precision", [("k1", "none"), ("topk", "none"), ("topk", "bf16")]
)
def test_split_passes_give_the_colocated_scores(tiny_model_dir, teacher_dir, estimator, precision):
    """bf16: the actor computes under bf16 autocast; the separate teacher scores under the
    same autocast, as the colocated one does under the actor's."""
    colocated, _ = _workers(tiny_model_dir, teacher_dir, estimator, False, precision)
    want = colocated.compute_teacher_log_prob(_batch())
    actor, teacher = _workers(tiny_model_dir, teacher_dir, estimator, True, precision)
    assert actor.teacher_engine is None  # the actor's workers hold no teacher
    assert teacher.engine.autocast_dtype == actor.engine.autocast_dtype
    assert (teacher.engine.autocast_dtype == torch.bfloat16) is (precision == "bf16")
    gen = _batch()
    got = SeparateTeacher(_Group(actor), _Group(teacher), estimator == "topk").submit(gen).result()
    keys = ["teacher_log_probs"]
    if estimator == "topk":
        keys += ["teacher_topk_log_probs"]
        assert got.batch.keys() == {"teacher_log_probs", "teacher_topk_log_probs"}
        assert torch.equal(gen.batch["distill_topk_ids"], want.batch["distill_topk_ids"])
        assert gen.batch["distill_topk_ids"].shape == (len(PROMPT_LENS), R, 4)
    mask = gen.batch["response_mask"].bool()
    for key in keys:
        torch.testing.assert_close(got.batch[key][mask], want.batch[key][mask], rtol=0, atol=TOL)
    assert got.batch["teacher_log_probs"][mask].abs().min() > 0


def test_teacher_worker_holds_no_optimizer_and_gets_no_gradient(tiny_model_dir, teacher_dir):
    actor, teacher = _workers(tiny_model_dir, teacher_dir, "topk", separate=True)
    module = teacher.engine.module
    before = {k: v.clone() for k, v in module.state_dict().items()}
    gen = _batch()
    gen.batch["advantages"] = torch.zeros_like(gen.batch["response_mask"])
    gen.union(SeparateTeacher(_Group(actor), _Group(teacher), True).submit(gen).result())
    metrics = actor.update_actor(gen)
    assert metrics["actor/distill_loss"] > 0 and metrics["actor/grad_norm"] > 0
    assert teacher.engine.optimizer is None
    for name, param in module.named_parameters():
        assert not param.requires_grad and param.grad is None, name
        assert torch.equal(param.detach(), before[name]), name
    assert teacher.head_size() == module.get_output_embeddings().weight.shape[0]


def test_the_actor_refuses_the_teacher_pass_when_the_teacher_is_apart(tiny_model_dir, teacher_dir):
    actor, _ = _workers(tiny_model_dir, teacher_dir, "k1", separate=True)
    with pytest.raises(RuntimeError, match="teacher_pool=separate"):
        actor.compute_teacher_log_prob(_batch())
    with pytest.raises(RuntimeError, match="estimator=topk"):
        actor.compute_distill_topk_ids(_batch())


# ---------------------------------------------------------------- two training steps


def _train(cfg) -> tuple[RLTrainer, list[dict], dict[str, torch.Tensor]]:
    trainer = RLTrainer(cfg, tracker=Tracker([]))
    try:
        trainer.fit()
        module = trainer.actor_rollout_wg.workers[0].engine.module
        weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
    finally:
        trainer.close()
    return trainer, trainer.history, weights


def _assert_same_runs(history_got, weights_got, history_want, weights_want) -> None:
    """Equal step metrics and weights within 1e-6 (``weights_got`` may hold fewer names: an
    export leaves out tied weights)."""
    assert len(history_got) == len(history_want) == 2
    for row_got, row_want in zip(history_got, history_want, strict=True):
        for key in COMPARED:
            assert row_got[key] == pytest.approx(row_want[key], abs=TOL), key
        assert row_want["actor/distill_loss"] != 0 and row_want["actor/grad_norm"] > 0
    assert weights_got and weights_got.keys() <= weights_want.keys()
    for name, value in weights_got.items():
        torch.testing.assert_close(value, weights_want[name], atol=TOL, rtol=0)


@pytest.mark.parametrize("estimator", ["k1", "topk"])
def test_two_steps_separate_equal_colocated(rl_config, teacher_dir, estimator):
    common = _distill(teacher_dir, estimator)
    want = _train(rl_config(*common))
    got = _train(rl_config(*common, *SEPARATE))
    assert "teacher" in got[0].placement.roles and "teacher" not in want[0].placement.roles
    assert got[0].teacher.__class__ is SeparateTeacher
    _assert_same_runs(*got[1:], *want[1:])


@pytest.mark.slow
def test_ray_teacher_on_a_device_of_its_own_trains_as_colocated(
    rl_config, ray_session, teacher_dir
):
    """Two Ray processes: the actor on device 0, the teacher alone on device 1 (the split
    topk pass crosses between them in the batch); the run equals the local colocated one."""
    common = _distill(teacher_dir, "topk")
    want = _train(rl_config(*common))
    trainer = RLTrainer(
        rl_config(
            *common,
            *SEPARATE,
            "trainer.n_gpus_per_node=2",
            "resource_pool.actor_devices=[0]",
            "resource_pool.teacher_devices=[1]",
        ),
        tracker=Tracker([]),
    )
    try:
        assert trainer.placement.backend == "ray"
        assert trainer.config.device_map.pools == {
            "actor_rollout_ref_pool": (0,),
            "teacher_pool": (1,),
        }
        result = trainer.fit()
    finally:
        trainer.close()
    exported = load_file(f"{result['hf_dir']}/model.safetensors")  # the Ray actor's weights
    _assert_same_runs(trainer.history, exported, *want[1:])


@pytest.mark.slow
def test_ray_teacher_sharded_over_two_devices_trains_as_colocated(
    rl_config, ray_session, teacher_dir
):
    """The teacher's pool has two devices: its engine is FSDP2 over them (the teacher's
    weights sharded), each scoring half the batch; k1, the run equals the colocated one."""
    common = _distill(teacher_dir, "k1")
    want = _train(rl_config(*common))
    trainer = RLTrainer(
        rl_config(
            *common,
            *SEPARATE,
            "trainer.n_gpus_per_node=3",
            "resource_pool.actor_devices=[0]",
            "resource_pool.teacher_devices=[1,2]",
        ),
        tracker=Tracker([]),
    )
    try:
        assert trainer.placement.roles["teacher"].world_size == 2
        result = trainer.fit()
    finally:
        trainer.close()
    exported = load_file(f"{result['hf_dir']}/model.safetensors")
    _assert_same_runs(trainer.history, exported, *want[1:])
