"""The tiny Qwen2.5-VL fixture loads the way users load a real checkpoint and generates on a video."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_tiny_qwen_loads_and_generates_on_video(tiny_qwen):
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(tiny_qwen)
    processor = transformers.AutoProcessor.from_pretrained(tiny_qwen)
    assert model.dtype == torch.float32

    tokenizer = processor.tokenizer
    for text in ["12.5 - 20.3 seconds", "From 0 to 3.75 s, (roughly); ok: Yes!\n"]:
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text

    video = torch.randint(0, 256, (8, 3, 56, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    content = [{"type": "video", "video": "clip.mp4"}, {"type": "text", "text": "What happens?"}]
    messages = [{"role": "user", "content": content}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>What happens?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )

    inputs = processor(
        text=[text],
        videos=[video],
        video_metadata=[{"fps": 2.0, "frames_indices": list(range(8)), "total_num_frames": 8}],
        do_sample_frames=False,
        return_tensors="pt",
    )
    for key in ["input_ids", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts", "mm_token_type_ids"]:
        assert key in inputs
    # 56x84 -> 2x3 merged tokens per frame pair, 8 frames -> 4 temporal groups.
    assert inputs["video_grid_thw"].tolist() == [[4, 4, 6]]
    assert inputs["second_per_grid_ts"].tolist() == [1.0]  # temporal_patch_size / fps
    num_video_tokens = int((inputs["input_ids"] == model.config.video_token_id).sum())
    assert num_video_tokens == int(inputs["video_grid_thw"].prod()) // 4 == 24

    prompt_len = inputs["input_ids"].shape[1]
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape[0] == 1 and prompt_len < out.shape[1] <= prompt_len + 5
    answer = processor.batch_decode(out[:, prompt_len:], skip_special_tokens=True)
    assert isinstance(answer[0], str)
