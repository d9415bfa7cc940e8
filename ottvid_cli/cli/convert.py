"""`ottvid convert`: checkpoints into formats transformers (and ottvid) load."""

from __future__ import annotations

import typer

from .errors import err, fail, out
from .help import HelpCommand, HelpGroup

convert_app = typer.Typer(cls=HelpGroup, help="Convert checkpoints into formats transformers (and ottvid) load.",
                          no_args_is_help=True)


@convert_app.command("llava-video", cls=HelpCommand)
def convert_llava_video(
    source: str = typer.Argument(..., help="Folder of a LLaVA-NeXT checkpoint (e.g. LLaVA-Video-7B-Qwen2)."),
    destination: str = typer.Argument(..., help="Folder to write the LLaVA-OneVision checkpoint to."),
    vision_heads: int = typer.Option(None, "--vision-heads", help="SigLIP heads, if the tower is not so400m (16)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write into a non-empty destination."),
) -> None:
    """Turn a LLaVA-NeXT LlavaQwen checkpoint into a transformers LLaVA-OneVision folder."""
    from ..convert import ConversionError
    from ..convert import convert_llava_video as convert

    try:
        with err.status("converting ..."):
            done = convert(source, destination, vision_heads=vision_heads, overwrite=overwrite)
    except ConversionError as exc:
        fail(str(exc))
    out.print(f"wrote {done.destination}: {done.tensors} tensors ({done.dropped} unused dropped), "
              f"{done.vision_layers} vision layers, {done.tokens_per_frame} tokens a frame, newline per "
              f"{done.newline_position}, {done.frames} frames by default", highlight=False)
