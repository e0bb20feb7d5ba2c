"""GRPO trainers for tests: the update settings come from grpo.algorithm's defaults in swerl/config/grpo.py (the one
home of every default), through the stage's own builder, with only what a test changes given."""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers import PreTrainedModel

from swerl.config.grpo import GRPOAlgorithmConfig
from swerl.stages.grpo import update_settings
from swerl.train.grpo_step import UpdateSettings
from swerl.train.grpo_trainer import GRPOTrainer

SETTING_NAMES = frozenset(field.name for field in dataclasses.fields(UpdateSettings))


def settings(**overrides: Any) -> UpdateSettings:
    """grpo.algorithm's defaults with these fields changed, as the trainer gets them."""
    return update_settings(GRPOAlgorithmConfig(**overrides))


def grpo_trainer(model: PreTrainedModel, **options: Any) -> GRPOTrainer:
    """A GRPOTrainer: options naming an UpdateSettings field change it, the rest go to the constructor."""
    changed = {key: value for key, value in options.items() if key in SETTING_NAMES}
    rest = {key: value for key, value in options.items() if key not in SETTING_NAMES}
    return GRPOTrainer(model, settings(**changed), **rest)
