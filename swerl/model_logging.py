"""The SFT and GRPO models in MLflow: a logged model (MLflow 3's LoggedModel, an output of the stage's run) with a
signature, registered as a new version of one registered model per pipeline.

The logged model is an MLflow pyfunc (`CheckpointModel`): prompt in, completion out, the checkpoint's weights and
tokenizer inside the model when they are at most MODEL_LOG_MAX_BYTES (a tiny or small model), otherwise only the
checkpoint's store URI (a 30B model is not copied into MLflow a second time; the store holds it). Everything is done
through MlflowClient with explicit ids (no fluent active run), as in swerl.tracking.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from pathlib import Path
from typing import Any

from swerl.tracking import StageRun

MODEL_LOG_MAX_BYTES = 2 * 1024**3
"""A checkpoint up to this size is copied into the MLflow model; a larger one is referenced by its store URI."""
MAX_NEW_TOKENS_DEFAULT = 256
"""The signature's default for the `max_new_tokens` inference param."""
REGISTRATION_WAIT_S = 60
"""How long to wait for a model version to be READY (a local store: at once)."""
MODEL_TYPE = "swe-agent-policy"

_log = logging.getLogger("swerl.tracking")


def registered_model_name(run_name: str, configured: str | None = None) -> str:
    """The registered model of a pipeline: `configured` (tracking.registered_model) when given, else
    `RUN_NAME-agent`."""
    return configured or f"{run_name}-agent"


def signature() -> Any:
    """prompt (string) -> completion (string), with the `max_new_tokens` param."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("string", "prompt")]),
        outputs=Schema([ColSpec("string", "completion")]),
        params=ParamSchema([ParamSpec("max_new_tokens", "long", MAX_NEW_TOKENS_DEFAULT)]),
    )


def _checkpoint_model() -> Any:
    import mlflow.pyfunc

    class CheckpointModel(mlflow.pyfunc.PythonModel):  # type: ignore[misc,name-defined]
        """A swerl checkpoint (transformers model + tokenizer) answering prompts with greedy completions."""

        def load_context(self, context: Any) -> None:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            path = context.artifacts.get("checkpoint") if context.artifacts else None
            if path is None:
                raise RuntimeError(
                    "this logged model references its checkpoint by store URI "
                    f"({(context.model_config or {}).get('checkpoint_uri')}); fetch it and load it with transformers"
                )
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModelForCausalLM.from_pretrained(path)
            self.model.eval()

        def predict(self, context: Any, model_input: Any, params: dict[str, Any] | None = None) -> list[str]:
            import torch

            limit = int((params or {}).get("max_new_tokens", MAX_NEW_TOKENS_DEFAULT))
            prompts = list(model_input["prompt"]) if hasattr(model_input, "__getitem__") else list(model_input)
            out = []
            for prompt in prompts:
                ids = self.tokenizer(str(prompt), return_tensors="pt").input_ids
                with torch.no_grad():
                    full = self.model.generate(ids, max_new_tokens=limit, do_sample=False)  # type: ignore[misc]
                out.append(str(self.tokenizer.decode(full[0, ids.shape[1] :], skip_special_tokens=True)))
            return out

    return CheckpointModel()


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _register(client: Any, registered: str, logged: Any, run_id: str, stage: str, checkpoint_uri: str) -> str:
    """A new version of the registered model `registered` (created on first use) from the logged model: NAME/VERSION."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(registered, description="swerl agent policies (SFT, GRPO phases)")
    except MlflowException as exc:
        if "RESOURCE_ALREADY_EXISTS" not in str(exc.error_code):
            raise
    version = client.create_model_version(
        registered,
        source=logged.artifact_location,
        run_id=run_id,
        model_id=logged.model_id,
        tags={"swerl.stage": stage, "swerl.checkpoint_uri": checkpoint_uri},
        await_creation_for=REGISTRATION_WAIT_S,
    )
    return f"{registered}/{version.version}"


def log_and_register(
    run: StageRun,
    experiment_id: str,
    local_dir: Path,
    *,
    stage: str,
    checkpoint_uri: str,
    registered: str | None,
) -> dict[str, str]:
    """Log `local_dir` (a saved checkpoint) as the run's output model and register it as a new version of
    `registered` (None: not registered); returns ids as tags (`swerl.model.*`). Failures are logged, never
    raised: the stage's checkpoint in the store is what later stages use."""
    import mlflow.pyfunc
    from mlflow.entities import LoggedModelOutput

    client = run.client
    try:
        import torch
        import transformers

        small = _size(local_dir) <= MODEL_LOG_MAX_BYTES
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "no input example": one would run the model to check it
            model_dir = Path(tmp) / "model"
            mlflow.pyfunc.save_model(
                path=str(model_dir),
                python_model=_checkpoint_model(),
                artifacts={"checkpoint": str(local_dir)} if small else None,
                model_config={"checkpoint_uri": checkpoint_uri, "stage": stage},
                signature=signature(),
                # given, so MLflow does not load the model in a subprocess to infer them
                pip_requirements=[
                    f"torch=={torch.__version__.split('+')[0]}",
                    f"transformers=={transformers.__version__}",
                ],
            )
            logged = client.create_logged_model(
                experiment_id,
                name=stage,
                source_run_id=run.run_id,
                model_type=MODEL_TYPE,
                params={"checkpoint_uri": checkpoint_uri, "weights_inside": str(small)},
            )
            client.log_model_artifacts(logged.model_id, str(model_dir))
        client.finalize_logged_model(logged.model_id, "READY")
        client.log_outputs(run.run_id, [LoggedModelOutput(logged.model_id, 0)])
        tags = {"swerl.model.id": logged.model_id, "swerl.model.weights_inside": str(small).lower()}
        if registered:
            tags |= {"swerl.model.registered": _register(client, registered, logged, run.run_id, stage, checkpoint_uri)}
        run.set_tags(tags)
        return tags
    except Exception as exc:  # noqa: BLE001 - the model stays in the store; say MLflow lacks it
        _log.warning("stage %s: could not log/register its model in MLflow: %s", stage, exc)
        return {}
