"""A reward-model ensemble as one reward source (`rlhf.rollout.rewards.ensemble`): its objectives over the members'
own normalised scores, on the text and the token-id paths, the metrics it logs, the bad ensembles it refuses, the
members the memory plan counts. Training on one: tests/trainers/test_grpo.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from ensembles import MEMBERS, write_ensemble
from rlhf.config import ConfigError
from rlhf.core.preference import ensemble_reward
from rlhf.inputs import check_reward_source
from rlhf.planning.sizes import reward_models as planned_reward_models
from rlhf.rollout.rewards import EnsembleReward, RewardError, RewardModelReward, RewardSet, load_reward_source

PROMPTS = ["the cat", "a dog", "one two"]
COMPLETIONS = [" sat on the mat", " ran", " three four five six"]


@pytest.fixture(scope="module")
def ensemble_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    return write_ensemble(tmp_path_factory.mktemp("ensemble") / "rm", tokenizer_dir)


@pytest.fixture(scope="module")
def member_scores(ensemble_dir: Path) -> torch.Tensor:
    """(B, M): each member loaded alone as a reward model scores the samples (its normalisation applied)."""
    members = [RewardModelReward.load(str(ensemble_dir / f"member_{m}")) for m in range(MEMBERS)]
    return torch.tensor([member.score(PROMPTS, COMPLETIONS) for member in members]).T


@pytest.mark.parametrize("objective", ["mean", "wco", "uwo"])
def test_the_ensemble_scores_its_objective_of_what_each_member_scores_alone(
    ensemble_dir, member_scores, tokenizer_dir, objective
):
    policy_tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    source = load_reward_source(
        str(ensemble_dir), policy_tokenizer=policy_tokenizer, objective=objective, uwo_lambda=0.7
    )
    assert isinstance(source, EnsembleReward) and source.name == "rm" and source.shares_policy_tokenizer
    expected = ensemble_reward(member_scores, objective, uwo_lambda=0.7)
    assert member_scores.std(-1).min() > 0  # the members disagree: the objectives differ
    # the same forwards, combined alike: float32 sums in one order, equal bits
    assert torch.equal(torch.tensor(source.score(PROMPTS, COMPLETIONS, {})), expected)
    encoded = [ids for ids in RewardModelReward.load(str(ensemble_dir / "member_0")).encode(PROMPTS, COMPLETIONS)]
    width = max(map(len, encoded))
    ids = torch.tensor([row + [0] * (width - len(row)) for row in encoded])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in encoded])
    # the token-id path pads the rows another way: float32 defaults (rtol 1.3e-6, atol 1e-5), as padding changes a
    # score by rounding only (docs/architecture.md, "Reward sources": tested to 1e-5)
    torch.testing.assert_close(source.score_ids(ids, mask), expected)


def test_a_reward_set_logs_the_members_spread_and_means_on_both_paths(ensemble_dir, member_scores, tokenizer_dir):
    policy_tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    rewards = RewardSet([load_reward_source(str(ensemble_dir), policy_tokenizer=policy_tokenizer)])
    scored = rewards.score(PROMPTS, COMPLETIONS)
    # the same float32 scores, reduced here and in the source: rel 1e-6 is a few float32 ulp (1.2e-7 each)
    std = member_scores.std(-1, correction=0).mean().item()
    assert scored.metrics["rm/ensemble_std"] == [pytest.approx(std, rel=1e-6)]
    for m in range(MEMBERS):
        assert scored.metrics[f"rm/member_{m}"] == [pytest.approx(member_scores[:, m].mean().item(), rel=1e-6)]
    tokens = [policy_tokenizer(p + c)["input_ids"] for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    width = max(map(len, tokens))
    ids = torch.tensor([[0] * (width - len(row)) + row for row in tokens])  # left padding, as the trainer's
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in tokens])
    assert set(rewards.score(PROMPTS, COMPLETIONS, token_ids=(ids, mask)).metrics) == set(scored.metrics)


def test_bad_ensembles_are_refused_naming_what_is_wrong(tmp_path, tokenizer_dir):
    one = write_ensemble(tmp_path / "one", tokenizer_dir, members=1)
    with pytest.raises(RewardError, match="lists 1 member.*at least 2"):
        load_reward_source(str(one))
    missing = write_ensemble(tmp_path / "missing", tokenizer_dir, members=2)
    (missing / "ensemble.json").write_text(json.dumps({"members": ["member_0", "member_1", "member_2"]}))
    with pytest.raises(RewardError, match="member directory missing: .*member_2"):
        load_reward_source(str(missing))
    with pytest.raises(ConfigError, match=r"reward.source=.*member directory missing"):
        check_reward_source("reward.source", str(missing))
    corrupt = write_ensemble(tmp_path / "corrupt", tokenizer_dir, members=2)
    (corrupt / "member_1" / "config.json").write_text("{not json")
    with pytest.raises(RewardError, match="member_1.*cannot read its config"):
        load_reward_source(str(corrupt))
    with pytest.raises(ConfigError, match="ensemble member member_1"):
        check_reward_source("reward.source", str(corrupt))
    (corrupt / "ensemble.json").write_text("[1, 2]")
    with pytest.raises(RewardError, match="cannot read ensemble.json"):
        load_reward_source(str(corrupt))
    with pytest.raises(RewardError, match="uwo_lambda must be ≥ 0"):
        EnsembleReward([], name="rm", objective="uwo", uwo_lambda=-1.0)


def test_wco_and_uwo_over_members_without_a_normalisation_warn_naming_the_field(
    ensemble_dir, tmp_path, tokenizer_dir, capsys
):
    for objective in ("mean", "wco", "uwo"):  # every member normalised: silent whatever the objective
        load_reward_source(str(ensemble_dir), objective=objective)
    assert "warning" not in capsys.readouterr().err
    raw = write_ensemble(tmp_path / "raw", tokenizer_dir, members=2)
    config = json.loads((raw / "member_1" / "config.json").read_text())
    del config["rlhf_reward_gain"], config["rlhf_reward_bias"]
    (raw / "member_1" / "config.json").write_text(json.dumps(config))
    load_reward_source(str(raw), objective="mean")  # the mean is as fair to raw members as any sum
    assert "warning" not in capsys.readouterr().err
    for objective in ("wco", "uwo"):
        load_reward_source(str(raw), objective=objective)
        err = capsys.readouterr().err
        assert f"objective {objective}" in err and "member_1 carry no normalisation" in err
        assert "member_0" not in err.split("but")[1] and "normalize.policy" in err


def test_the_memory_plan_counts_every_member(ensemble_dir):
    from rlhf.config.sections import RewardSection

    members = planned_reward_models(RewardSection(source=str(ensemble_dir)))
    assert members == [str(ensemble_dir / f"member_{m}") for m in range(MEMBERS)]
