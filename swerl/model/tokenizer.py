"""A local byte-level BPE tokenizer trained on project text (nothing touches a model hub), saved so that
transformers 4.x and 5.x readers load it alike."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from swerl.model.chat import CHAT_TEMPLATE, CONTROL_TOKENS, IM_END, PAD_TOKEN, TOOL_TAG_TOKENS

# Every newline and digit is its own pre-token: line numbers then tokenize the same way in an observation (`cat -n`
# output) and in an action (`sed -n 12,14p`), and a segment that ends with "\n" tokenizes independently of what
# follows (see render_messages). Runs of punctuation stay together (the byte-level regex keeps ` ?[^\s\p{L}\p{N}]+`
# as one pre-token), so BPE may merge them: `{"`, `":`, ` <=` are one token each, which makes a tool call ~35%
# shorter than with every punctuation character alone, and an operator with its leading space tokenizes the same
# in code and in a sed substitution.
_ISOLATE_PATTERN = r"\n|\p{N}"


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | Path) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on local text and save it in Hugging Face format to out_dir."""
    special_tokens = [*CONTROL_TOKENS, *TOOL_TAG_TOKENS]
    if vocab_size < 256 + len(special_tokens):
        raise ValueError(f"vocab_size {vocab_size} is below the 256 byte tokens plus {len(special_tokens)} specials")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_ISOLATE_PATTERN), behavior="isolated"),
            # add_prefix_space=False: a segment tokenized alone must not gain a leading space.
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,  # ids 0..6, counted within vocab_size
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable, whatever the corpus
        min_frequency=2,
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer)
    # Re-adding an existing token updates its flags: the tool tags keep their ids but stop being special.
    backend.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TOOL_TAG_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,  # a chat model ends its turn with <|im_end|>, as Qwen3 instruct models do
        pad_token=PAD_TOKEN,
        model_max_length=1 << 30,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    save_tokenizer(tokenizer, out_dir)
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> Path:
    """Save a tokenizer so that transformers 4.x readers (e.g. an SGLang install) load it as well as 5.x."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # save_jinja_files=False keeps the chat template inside tokenizer_config.json, where every reader looks.
    tokenizer.save_pretrained(out, save_jinja_files=False)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        # 5.x names its fast tokenizer class TokenizersBackend; PreTrainedTokenizerFast is the alias both know.
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return out
