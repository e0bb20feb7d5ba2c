"""Run configuration: pydantic models, one section per stage, loaded from YAML with dotted overrides.

Every limit the pipeline obeys is a field here, bounded and documented; nothing is left to a library default.
Each section lives in the submodule that defines it (swerl.config.engine, .grpo, .sandbox, ...): import it from
there. The package exports only what a caller of the whole config needs.
"""

from swerl.config.base import ConfigError
from swerl.config.load import load_config
from swerl.config.pipeline import PipelineConfig

__all__ = ["ConfigError", "PipelineConfig", "load_config"]
