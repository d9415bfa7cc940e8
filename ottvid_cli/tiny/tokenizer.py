"""The tokenizers of the tiny random checkpoints (`ottvid_cli.tiny`): a byte-level BPE trained on a small
in-memory corpus (Qwen2's pre-tokenizer), the real added tokens in their real order and the real chat templates
of Qwen2.5-VL, Qwen3-VL and LLaVA-OneVision. Nothing is downloaded."""

from __future__ import annotations

import json


# Qwen2's pre-tokenisation regex (same as transformers' Qwen2Tokenizer): digits are
# split one by one, letters are grouped with an optional leading non-letter.
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen2.5's added tokens, in their real order (real ids start at 151643). The ids
# here start right after the tiny BPE vocabulary but keep the same relative order.
# (token, special)
_QWEN_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]

# The content items of a user turn, as Qwen2.5-VL's and Qwen3-VL's chat templates render them.
_QWEN_VL_CONTENT = (
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}"
    "{{ content['text'] }}"
    "{% endif %}"
    "{% endfor %}"
)

# Chat template of Qwen2.5-VL-*-Instruct (chat_template.json of the hub checkpoints).
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n"
    "{% else %}"
    + _QWEN_VL_CONTENT
    + "<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|im_start|>assistant\n"
    "{% endif %}"
)

_CORPUS_WORDS = (
    "the a an of to and in is it that on for with as was at by from this these those there here "
    "video clip shows show person people man woman child dog cat car ball bike door table chair "
    "kitchen room street walks runs jumps opens closes picks puts holds takes sits stands moves "
    "what when where who why how does do did happens happen happened begin begins end ends start "
    "starts stop stops second seconds minute minutes time timestamp frame frames scene event "
    "between before after during until then first last answer question yes no not none "
    "you are helpful assistant system user describe find locate moment"
).split()


def _corpus() -> list[str]:
    n = len(_CORPUS_WORDS)
    lines = [" ".join(_CORPUS_WORDS[i:] + _CORPUS_WORDS[:i]) for i in range(n)]
    lines += [w.capitalize() + "." for w in _CORPUS_WORDS]
    lines += [
        "0 1 2 3 4 5 6 7 8 9 10 11 12 20 30 45 60 100",
        "12.5 - 20.3 seconds. From 0.0 to 3.5 seconds, then 7 - 9 s.",
        "What happens? It happens between 1.5 and 4.0 seconds, (roughly); ok: yes!",
    ]
    return lines


def _train_bpe(vocab_size: int = 512) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a tiny byte-level BPE (Qwen2 pre-tokenizer) and return (vocab, merges)."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes -> lossless round trip
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = {str(k): int(v) for k, v in model["vocab"].items()}
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return vocab, merges


def build_qwen2_tokenizer(
    added_tokens: list[tuple[str, bool]],
    chat_template: str,
    extra_special_tokens: list[str],
):
    """Byte-level BPE ``Qwen2Tokenizer`` with ``added_tokens`` (token, special) given the ids right
    after the tiny trained vocabulary, in order; eos ``<|im_end|>``, pad ``<|endoftext|>``."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = _train_bpe()
    base = len(vocab)
    assert sorted(vocab.values()) == list(range(base))
    for i, (token, _special) in enumerate(added_tokens):
        vocab[token] = base + i

    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",  # as in the Qwen2.5-VL / LLaVA-OneVision tokenizer_config.json
        pad_token="<|endoftext|>",
        add_prefix_space=False,
        errors="replace",
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        model_max_length=131072,
        extra_special_tokens=extra_special_tokens,
    )
    # Register every added token (already in the vocab, so ids are unchanged).
    tokenizer.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in added_tokens])
    tokenizer.chat_template = chat_template

    for i, (token, _special) in enumerate(added_tokens):
        got = tokenizer.convert_tokens_to_ids(token)
        if got != base + i:
            raise RuntimeError(f"special token {token!r} got id {got}, expected {base + i}")
    return tokenizer


def qwen2_5_vl_tokenizer():
    """The Qwen2.5-VL tokenizer (all of Qwen2.5's added tokens, Qwen2.5-VL chat template)."""
    return build_qwen2_tokenizer(
        _QWEN_ADDED_TOKENS,
        QWEN2_5_VL_CHAT_TEMPLATE,
        extra_special_tokens=[t for t, special in _QWEN_ADDED_TOKENS if special and t != "<|endoftext|>"],
    )


# Added tokens of llava-hf/llava-onevision-qwen2-7b-ov-hf, in their real order (real ids
# 151643..151647): Qwen2's three plus the LLaVA image / video placeholders. (token, special)
_LLAVA_OV_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<image>", True),
    ("<video>", True),
]

# Chat template of llava-hf/llava-onevision-qwen2-*-ov-hf (chat_template.json): the role is
# followed by a space (not a newline), then all images, then all videos of the message, then
# each text item prefixed by a newline; no default system prompt; content must be a list.
LLAVA_ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + ' '}}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{# Render all video then #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>' }}{% endfor %}"
    "{# Render all text next #}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ '\n' + content['text'] }}"
    "{% endfor %}"
    "{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\n' + content['text'] }}{% endgeneration %}"
    "{% endfor %}"
    "{% endif %}"
    "{{'<|im_end|>\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def llava_onevision_tokenizer():
    """The LLaVA-OneVision tokenizer (Qwen2's three added tokens, <image>, <video>, its chat template)."""
    return build_qwen2_tokenizer(
        _LLAVA_OV_ADDED_TOKENS,
        LLAVA_ONEVISION_CHAT_TEMPLATE,
        extra_special_tokens=["<|im_start|>", "<|im_end|>", "<image>", "<video>"],
    )


# Qwen3-VL's added tokens: Qwen2.5's, then Qwen3's tool-response and thinking tags (real ids
# 151665..151668), in their real order.
_QWEN3_ADDED_TOKENS: list[tuple[str, bool]] = _QWEN_ADDED_TOKENS + [
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]

# The part of Qwen3-VL-*-Instruct's chat template (chat_template.json) that a user turn with a video
# and text uses: no default system prompt (unlike Qwen2.5-VL), a video as
# <|vision_start|><|video_pad|><|vision_end|>, which the processor expands to one timestamp and
# one vision_start / tokens / vision_end block per temporal group. Tools and thinking are left out.
QWEN3_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}"
    "{% else %}"
    + _QWEN_VL_CONTENT
    + "{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|im_start|>assistant\n"
    "{% endif %}"
)


def qwen3_vl_tokenizer():
    """The Qwen3-VL tokenizer (Qwen2.5's added tokens plus Qwen3's, the Qwen3-VL chat template)."""
    return build_qwen2_tokenizer(
        _QWEN3_ADDED_TOKENS,
        QWEN3_VL_CHAT_TEMPLATE,
        extra_special_tokens=[t for t, special in _QWEN3_ADDED_TOKENS if special and t != "<|endoftext|>"],
    )

