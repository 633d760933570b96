"""Container images for `opspatch bake`: the runtime's image commands as data, the build context
of a baked image, and the labels that say which patch an image carries."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opspatch.core.host import ContainerRuntime
from opspatch.errors import InputError
from opspatch.hosts.transport.base import Command, CommandResult, Transport
from opspatch.hosts.transport.container import refused_rlimit, rlimit_hint, runtime_words
from opspatch.hosts.transport.local import LocalTransport

LABEL_PATCH = "io.opspatch.patch"
LABEL_PATCH_SHA256 = "io.opspatch.patch-sha256"
LABEL_FILES = "io.opspatch.files"
LABEL_PRE_IMAGE_SHA256 = "io.opspatch.pre-image-sha256"
LABEL_POST_IMAGE_SHA256 = "io.opspatch.post-image-sha256"
LABEL_RUN = "io.opspatch.run"
LABEL_BASE_NAME = "org.opencontainers.image.base.name"
LABEL_BASE_DIGEST = "org.opencontainers.image.base.digest"
"""Lists (files, their pre- and post-image hashes) are space-separated, in the patch's target
order: one entry per file of a patch set."""
LABEL_EARLIER_BAKES = "io.opspatch.earlier-bakes"
"""An image baked onto an image opspatch baked already: the base's bakes, newest first, as a
JSON list of each one's labels above (`BAKE_KEYS`), so a bake never drops the one before."""
BAKE_KEYS = (
    LABEL_PATCH,
    LABEL_PATCH_SHA256,
    LABEL_FILES,
    LABEL_PRE_IMAGE_SHA256,
    LABEL_POST_IMAGE_SHA256,
    LABEL_RUN,
    LABEL_BASE_NAME,
)

CONTAINERFILE = "Containerfile"
FILES_DIR = "files"
DIFF_FILE = "patch.diff"

IMAGE_TIMEOUT = 60.0
"""Seconds for an image inspect, a scratch container's start or removal."""
BUILD_TIMEOUT = 600.0
"""Seconds for a build (a copy of a few files on top of the base: seconds, in practice)."""

_NO_RUNTIME_STATUS = 127
_MISSING_IMAGE_WORDS = ("image not known", "no such image", "no such object", "not found")
_PERMISSION_WORDS = ("permission denied", "access denied", "operation not permitted")


@dataclass(frozen=True)
class ImageIdentity:
    """An image as the runtime inspected it: the reference asked for, its id and its labels."""

    runtime: ContainerRuntime
    reference: str
    id: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class BakedFile:
    """One file of a baked image: where it goes, its new bytes, its mode and owner (numeric,
    as the image's file had them), and its pre- and post-image sha256."""

    path: str
    content: bytes
    mode: int
    uid: int
    gid: int
    sha256_before: str
    sha256_after: str

    @property
    def context_path(self) -> str:
        """Where the build context keeps the bytes: `files/<absolute path without its />`."""
        return f"{FILES_DIR}/{self.path.lstrip('/')}"


@dataclass(frozen=True)
class BakedLabels:
    """What an image's (or its container's) labels say it was baked with."""

    patch_id: str
    patch_sha256: str
    files: tuple[str, ...]
    pre_image_sha256: tuple[str, ...]
    post_image_sha256: tuple[str, ...]
    run_id: str
    base: str

    def post_image_of(self, path: str) -> str | None:
        """The sha256 the bake wrote at `path`, or None when the bake did not write it."""
        for file, sha in zip(self.files, self.post_image_sha256, strict=False):
            if file == path:
                return sha
        return None


def bake_labels(
    *,
    patch_id: str,
    patch_sha256: str,
    files: Sequence[BakedFile],
    run_id: str,
    base: ImageIdentity,
) -> dict[str, str]:
    """The labels of an image baked from `base` with `files` (pure); a base opspatch baked
    already has its bakes carried along (`LABEL_EARLIER_BAKES`).

    Raises:
        InputError: the base's `LABEL_EARLIER_BAKES` is not what a bake writes (it would be
            lost).
    """
    labels = {
        LABEL_PATCH: patch_id,
        LABEL_PATCH_SHA256: patch_sha256,
        LABEL_FILES: " ".join(f.path for f in files),
        LABEL_PRE_IMAGE_SHA256: " ".join(f.sha256_before for f in files),
        LABEL_POST_IMAGE_SHA256: " ".join(f.sha256_after for f in files),
        LABEL_RUN: run_id,
        LABEL_BASE_NAME: base.reference,
        LABEL_BASE_DIGEST: base.id,
    }
    earlier = earlier_bakes(base.labels)
    if read_baked_labels(base.labels) is not None:
        earlier = [{k: base.labels[k] for k in BAKE_KEYS if k in base.labels}, *earlier]
    if earlier:
        labels[LABEL_EARLIER_BAKES] = json.dumps(earlier, sort_keys=True, separators=(",", ":"))
    return labels


def earlier_bakes(labels: Mapping[str, str]) -> list[dict[str, str]]:
    """The earlier bakes `labels` carry (`LABEL_EARLIER_BAKES`), newest first (pure).

    Raises:
        InputError: the label is there but not a JSON list of string-valued objects.
    """
    raw = labels.get(LABEL_EARLIER_BAKES)
    if raw is None:
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(
        isinstance(entry, dict) and all(isinstance(v, str) for v in entry.values())
        for entry in value
    ):
        raise InputError(
            f"the image's label {LABEL_EARLIER_BAKES} is not a JSON list of earlier bakes, "
            "as opspatch writes it; nothing was built",
            hint="bake from the image it was built from, or fix the label",
        )
    return value


def baked_history(labels: Mapping[str, str]) -> tuple[BakedLabels, ...]:
    """Every bake `labels` record, newest first; a label that cannot be read records none of
    the earlier ones (pure: never raises, it only reads)."""
    newest = read_baked_labels(labels)
    if newest is None:
        return ()
    try:
        earlier = earlier_bakes(labels)
    except InputError:
        earlier = []
    return (newest, *(b for b in map(read_baked_labels, earlier) if b is not None))


def read_baked_labels(labels: Mapping[str, str]) -> BakedLabels | None:
    """What `labels` say an image was last baked with; None when they name no bake (pure)."""
    patch_id = labels.get(LABEL_PATCH)
    if not patch_id:
        return None
    return BakedLabels(
        patch_id=patch_id,
        patch_sha256=labels.get(LABEL_PATCH_SHA256, ""),
        files=tuple(labels.get(LABEL_FILES, "").split()),
        pre_image_sha256=tuple(labels.get(LABEL_PRE_IMAGE_SHA256, "").split()),
        post_image_sha256=tuple(labels.get(LABEL_POST_IMAGE_SHA256, "").split()),
        run_id=labels.get(LABEL_RUN, ""),
        base=labels.get(LABEL_BASE_NAME, ""),
    )


def build_context(
    base: str, files: Sequence[BakedFile], labels: Mapping[str, str], diff: str | None = None
) -> dict[str, bytes]:
    """The build context of a baked image, by relative path (pure): the Containerfile (`FROM
    base`, one `COPY` per file keeping its mode and owner, the labels) and each file's bytes;
    `patch.diff` is the plan's diff (module paths: `git apply --directory=python` in an editable
    checkout); the build does not read it."""
    lines = [
        "# Written by `opspatch bake`: the base image with the patched file(s) copied over the",
        "# originals (mode and owner kept); the labels name the patch and each file's sha256.",
        f"FROM {base}",
    ]
    for file in files:
        lines.append(
            f"COPY --chown={file.uid}:{file.gid} --chmod={file.mode & 0o7777:04o} "
            f"{json.dumps([file.context_path, file.path])}"
        )
    lines.append("LABEL " + " \\\n      ".join(f"{k}={json.dumps(v)}" for k, v in labels.items()))
    context = {CONTAINERFILE: ("\n".join(lines) + "\n").encode()}
    for file in files:
        context[file.context_path] = file.content
    if diff:
        context[DIFF_FILE] = diff.encode()
    return context


# ---------------------------------------------------------------------------------------------
# commands as data


def image_inspect_command(runtime: ContainerRuntime, reference: str) -> Command:
    return Command((runtime, "image", "inspect", reference))


def scratch_run_command(runtime: ContainerRuntime, image: str, name: str) -> Command:
    """A container from `image` that runs nothing of the image's own (`sleep` instead of its
    entrypoint), with no network, removed when it stops: where the bake reads and checks the
    image's files with the image's interpreter."""
    return Command(
        (
            runtime, "run", "--detach", "--rm", "--network=none", "--name", name,
            "--entrypoint", "sleep", image, "infinity",
        )
    )  # fmt: skip


def remove_command(runtime: ContainerRuntime, name: str) -> Command:
    return Command((runtime, "rm", "--force", "--time", "0", name))


def remove_image_command(runtime: ContainerRuntime, tag: str) -> Command:
    return Command((runtime, "rmi", tag))


def build_command(runtime: ContainerRuntime, tag: str, directory: str) -> Command:
    """`<runtime> build` of a context written by `build_context` (offline: `--network=none`)."""
    return Command(
        (runtime, "build", "--network=none", "-t", tag, "-f", f"{directory}/{CONTAINERFILE}",
         directory)
    )  # fmt: skip


def parse_image_inspect(runtime: ContainerRuntime, reference: str, stdout: bytes) -> ImageIdentity:
    """The image `image inspect` printed (pure; podman and docker print the same keys).

    Raises:
        ValueError: the output is not one image's inspect document.
    """
    data = json.loads(stdout.decode("utf-8"))
    if not isinstance(data, list) or len(data) != 1 or not isinstance(data[0], dict):
        raise ValueError("expected a JSON array with one image")
    found: dict[str, Any] = data[0]
    config = found.get("Config") if isinstance(found.get("Config"), dict) else {}
    labels = found.get("Labels") or (config or {}).get("Labels") or {}
    return ImageIdentity(
        runtime=runtime,
        reference=reference,
        id=str(found["Id"]),
        labels={str(k): str(v) for k, v in labels.items()},
    )


# ---------------------------------------------------------------------------------------------
# effects: the runtime on the controller's machine


class ImageRuntime:
    """The container runtime where images are built, reached through `transport`."""

    def __init__(self, transport: Transport, runtime: ContainerRuntime) -> None:
        self.transport = transport
        self.runtime = runtime

    @classmethod
    def on_controller(cls, runtime: ContainerRuntime) -> ImageRuntime:
        """The runtime of this machine (`opspatch bake` builds where it runs)."""
        return cls(LocalTransport("controller"), runtime)

    @staticmethod
    def words(result: CommandResult) -> str:
        """What the runtime said in `result` (a failed build or removal), in its own words."""
        return runtime_words(result)

    def inspect(self, reference: str) -> ImageIdentity:
        """The image `reference` names.

        Raises:
            InputError: the runtime is not installed or not allowed, or has no such image.
        """
        found = self.find(reference)
        if isinstance(found, CommandResult):
            raise InputError(
                f"image {reference} not found by {self.runtime} ({runtime_words(found)}); "
                "nothing was built",
                hint=f"check `{self.runtime} images`, or pull or build the image first",
            )
        return found

    def find(self, reference: str) -> ImageIdentity | CommandResult:
        """The image `reference` names, or the runtime's answer saying it has none.

        Raises:
            InputError: the runtime is not installed or not allowed, or its answer is unreadable.
        """
        result = self._run(image_inspect_command(self.runtime, reference), IMAGE_TIMEOUT)
        if not result.ok:
            words = runtime_words(result)
            if _has(words, _MISSING_IMAGE_WORDS) and result.exit_code != _NO_RUNTIME_STATUS:
                return result
            raise self._refusal(result, f"cannot inspect image {reference}")
        try:
            return parse_image_inspect(self.runtime, reference, result.stdout)
        except (ValueError, KeyError) as exc:
            raise InputError(
                f"image {reference}: could not read `{self.runtime} image inspect`: {exc}"
            ) from None

    def start_scratch(self, image: str, name: str) -> None:
        """Start the scratch container `name` from `image`.

        Raises:
            InputError: the runtime refused (the image has no `sleep`, say), in its words.
        """
        result = self._run(scratch_run_command(self.runtime, image, name), IMAGE_TIMEOUT)
        if not result.ok:
            raise self._refusal(
                result, f"cannot start a scratch container from image {image} to read its files"
            )

    def remove(self, name: str) -> None:
        """Remove the container `name` (best effort: `--rm` removes it when it stops anyway)."""
        self._run(remove_command(self.runtime, name), IMAGE_TIMEOUT)

    def remove_image(self, tag: str) -> CommandResult:
        """Untag (and so remove) the image `tag`; the result, succeeded or not."""
        return self._run(remove_image_command(self.runtime, tag), IMAGE_TIMEOUT)

    def build(self, tag: str, directory: str) -> CommandResult:
        """Build the context in `directory` as `tag`; the result, succeeded or not."""
        return self._run(build_command(self.runtime, tag, directory), BUILD_TIMEOUT)

    def _run(self, command: Command, timeout: float) -> CommandResult:
        return self.transport.run(command, timeout=timeout)

    def _refusal(self, result: CommandResult, what: str) -> InputError:
        words = runtime_words(result)
        if result.exit_code == _NO_RUNTIME_STATUS:
            return InputError(
                f"{what}: {self.runtime} is not installed here ({words}); nothing was built",
                hint=f"install {self.runtime}, or name another with --runtime",
            )
        limit = refused_rlimit(words)
        if limit is not None:  # reads as a permission error, to root too: name the limit
            return InputError(
                f"{what}: {self.runtime} could not set {limit} for the container, higher than "
                f"this machine allows ({words}); nothing was built",
                hint=rlimit_hint(self.runtime),
            )
        if _has(words, _PERMISSION_WORDS):
            return InputError(
                f"{what}: this user may not use {self.runtime} ({words}); nothing was built",
                hint=f"run as a user allowed to use {self.runtime} (root for rootful podman, "
                "the docker group for docker)",
            )
        return InputError(f"{what}: {self.runtime} says: {words}; nothing was built")


def _has(words: str, needles: tuple[str, ...]) -> bool:
    lowered = words.lower()
    return any(needle in lowered for needle in needles)
