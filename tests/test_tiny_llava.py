"""The tiny LLaVA-OneVision fixture loads the way users load llava-hf/llava-onevision-qwen2-7b-ov-hf
and generates on a video."""

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_tiny_llava_onevision_loads_and_generates_on_video(tiny_llava_ov):
    model = transformers.LlavaOnevisionForConditionalGeneration.from_pretrained(tiny_llava_ov).eval()
    processor = transformers.AutoProcessor.from_pretrained(tiny_llava_ov)
    assert isinstance(processor, transformers.LlavaOnevisionProcessor)
    assert model.dtype == torch.float32

    config = model.config
    tokenizer = processor.tokenizer
    assert config.vision_config.image_size == 384 and config.vision_config.patch_size == 14
    assert config.vision_feature_layer == -1 and config.vision_feature_select_strategy == "full"
    assert config.image_token_id == tokenizer.convert_tokens_to_ids("<image>") == processor.image_token_id
    assert config.video_token_id == tokenizer.convert_tokens_to_ids("<video>") == processor.video_token_id
    assert config.text_config.vocab_size == len(tokenizer)
    for text in ["12.5 - 20.3 seconds", "From 0 to 3.75 s, (roughly); ok: Yes!\n"]:
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text

    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user <video>\nWhat happens?<|im_end|>\n<|im_start|>assistant\n"

    video = np.random.default_rng(0).integers(0, 256, (4, 240, 320, 3), dtype=np.uint8)  # (T, H, W, C)
    inputs = processor(text=[text], videos=[video], return_tensors="pt")
    assert tuple(inputs["pixel_values_videos"].shape) == (1, 4, 3, 384, 384)
    # 27x27 SigLIP patches a frame, pooled to 14x14 = 196 tokens, plus one newline token per video.
    num_video_tokens = int((inputs["input_ids"] == config.video_token_id).sum())
    assert num_video_tokens == 4 * 196 + 1

    with torch.no_grad():
        features = model.model.get_video_features(inputs["pixel_values_videos"]).pooler_output
    assert tuple(features.shape) == (1, num_video_tokens, config.text_config.hidden_size)
    # The newline embedding comes once, after all frames.
    torch.testing.assert_close(features[0, -1], model.model.image_newline)

    prompt_len = inputs["input_ids"].shape[1]
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape[0] == 1 and prompt_len < out.shape[1] <= prompt_len + 5
    again = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert torch.equal(out, again)  # greedy, deterministic
