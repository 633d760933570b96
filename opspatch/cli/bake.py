"""`opspatch bake`: a new image on top of one, with the patch baked in (`opspatch.runs.commands.bake`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from opspatch.cli.context import options
from opspatch.cli.params import JsonOption, PatchArgument, PlaybookOption
from opspatch.cli.render import LiveProgress, finish
from opspatch.errors import InputError


def bake(
    patch: PatchArgument,
    image: Annotated[
        str,
        typer.Option(
            "--image",
            help="The image to bake the patch into (its files are planned on).",
            metavar="IMAGE",
        ),
    ],
    tag: Annotated[
        str | None,
        typer.Option(
            "--tag",
            help="The new image's name.",
            metavar="TAG",
            show_default="IMAGE's repository, its tag + '-' + the patch id",
        ),
    ] = None,
    dockerfile: Annotated[
        Path | None,
        typer.Option(
            "--dockerfile",
            help="Write the build context (Containerfile, patched files, diff) to this new "
            "directory and print the build command, instead of building.",
            metavar="DIR",
        ),
    ] = None,
    runtime: Annotated[
        str, typer.Option("--runtime", help="podman or docker.", metavar="RUNTIME")
    ] = "podman",
    python: Annotated[
        str, typer.Option("--python", help="The image's interpreter.", metavar="PYTHON")
    ] = "python3",
    playbook: PlaybookOption = "default",
    as_json: JsonOption = False,
) -> None:
    """Bake a patch into a new image: plan and check it on the image's own files, build FROM it."""
    from opspatch.runs.commands.bake import BakeRequest, bake_image, default_tag

    if runtime not in ("podman", "docker"):
        raise InputError(f"--runtime {runtime!r}: expected podman or docker; nothing was built")
    loaded = options.load_patch(patch)
    request = BakeRequest(
        image=image,
        tag=tag,
        context_dir=dockerfile,
        runtime="podman" if runtime == "podman" else "docker",
        python=python,
    )
    playbook_obj = options.load_playbook(playbook)
    ledger = options.open_ledger()
    name = tag or default_tag(image, loaded.spec.id)
    with LiveProgress([name], enabled=not as_json) as progress:
        report = bake_image(loaded, request, playbook_obj, ledger=ledger, progress=progress)
    finish(report, as_json)


def register(app: typer.Typer) -> None:
    app.command()(bake)
