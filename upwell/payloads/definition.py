"""A payload definition: what a lab's tool is, how it runs, and what it reports. Data, never code.

A definition is YAML checked against ``Definition`` (the JSON Schema in
``payloads/schema/definition-v<N>.json`` is generated from it). ``load`` reports
every problem with its path in the file; five mistakes get a named code:

- ``image-not-digest``: ``image`` has a tag (or nothing) instead of ``@sha256:<digest>``;
- ``registry-not-allowed``: the image's registry is not on the operator's allowlist;
- ``unknown-placeholder``: an argv element names ``{x}`` that is neither a param nor a built-in;
- ``param-without-type``: a param has no ``type``;
- ``command-not-argv``: ``command`` (or another argv) is a shell string instead of a list.

Placeholders are substituted inside one argv element and never split it, and no
shell runs, so metacharacters in values are inert. ``{{`` and ``}}`` are literal braces.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from upwell.after.spec import ReduceSpec

SCHEMA_VERSION = 1
NAME = r"^[a-z][a-z0-9-]{0,62}$"
DIGEST = re.compile(r"^(?P<repo>[^@\s]+)@sha256:(?P<digest>[0-9a-f]{64})$")
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
# Values the runner supplies for every item, beside the definition's params.
BUILTINS = frozenset({"workdir", "out", "ckpt", "input", "ranks", "gpus", "job_id", "shard_id", "attempt", "python"})
SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")

Argv = list[str]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Param(_Strict):
    """One typed parameter. ``path`` is a relative path that must stay inside the work dir."""

    type: Literal["int", "float", "str", "bool", "enum", "path"]
    default: Any = None
    required: bool = Field(False, description="a manifest must give a value (no default)")
    description: str = ""
    min: float | None = None
    max: float | None = None
    pattern: str | None = Field(None, description="a full-match regular expression for str and path values")
    choices: list[str | int | float] | None = Field(None, description="the allowed values of an enum")

    @model_validator(mode="after")
    def _consistent(self) -> Param:
        if self.type == "enum" and not self.choices:
            raise ValueError("an enum param needs choices")
        if self.type != "enum" and self.choices:
            raise ValueError("choices belong to enum params")
        if self.pattern is not None:
            re.compile(self.pattern)
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        if self.required and self.default is not None:
            raise ValueError("a required param has no default")
        return self


class Launcher(_Strict):
    """How the command is started: as is, under the image's MPI launcher, or under torchrun."""

    kind: Literal["plain", "mpi", "torchrun"] = "plain"
    mpiexec: Argv = Field(default_factory=lambda: ["mpiexec", "-n", "{ranks}"],
                          description="the MPI launcher inside the image, put before command when kind is mpi")
    torchrun: Argv = Field(default_factory=lambda: ["torchrun", "--standalone", "--nproc_per_node", "{ranks}"],
                           description="put before command when kind is torchrun")


class Resources(_Strict):
    cpus: int = Field(1, ge=1, le=512)
    gpus: int = Field(0, ge=0, le=16)
    memory_gb: float = Field(1.0, gt=0, le=4096)
    ranks: int = Field(1, ge=1, le=1024, description="MPI ranks in all; spread over nodes")
    nodes: int = Field(1, ge=1, le=64, description="nodes of one allocation the shard runs on (Slurm, Batch)")
    ranks_per_node: int | None = Field(None, ge=1, le=1024, description="instead of ranks: ranks on each node")
    oversubscribe: bool = Field(False, description="allow more ranks on a node than it has cores")


class InputSpec(_Strict):
    """Where a shard's data blob is placed in the work dir; ``{input}`` becomes that path."""

    required: bool = False
    path: str = Field("input/data", description="relative to the work dir")


class PostStep(_Strict):
    """Another argv run in the same image after the command succeeds (e.g. ``gmx energy``)."""

    command: Argv
    stdin: str = Field("", description="text fed to the step's standard input (e.g. gmx energy's term picks)")
    metrics_json: str = Field("", description="a JSON file of metrics the step writes, relative to the work dir")
    metrics_regex: dict[str, str] = Field(default_factory=dict, description="metric -> regex over the step's output")


class Outputs(_Strict):
    artifacts: list[str] = Field(default_factory=list, description="globs relative to the work dir")
    metrics_json: str = Field("", description="a JSON file of metrics the tool writes, relative to the work dir")
    metrics_regex: dict[str, str] = Field(default_factory=dict,
                                          description="metric -> regex over the tool's log; group 'value' or 1")
    post: list[PostStep] = Field(default_factory=list)


class Checkpoint(_Strict):
    """The checkpoint contract. Only files matching ``files`` are the checkpoint: they alone make the next
    attempt a resume (and a stopped tool's exit a preemption). ``keep`` files travel with them (a log the tool
    appends to on resume) but never count. An empty checkpoint file, one that fails ``verify``, or one the
    tool cannot resume from (it fails without writing a newer one) is dropped and the attempt starts fresh."""

    signal: Literal[SIGNALS] = "SIGTERM"  # type: ignore[valid-type]
    grace_s: float = Field(30.0, gt=0, le=600)
    files: list[str] = Field(default_factory=list,
                             description="globs (relative to the work dir) of the checkpoint itself: only these count")
    keep: list[str] = Field(default_factory=list,
                            description="globs of other files kept beside the checkpoint (a log appended on resume); "
                                        "they never make an attempt a resume")
    verify: Argv = Field(default_factory=list,
                         description="argv run before a resume; a non-zero exit drops the checkpoint (fresh start)")
    history: int = Field(1, ge=1, le=100,
                         description="how many of each glob's newest matches are kept (1: only the newest checkpoint)")
    resume: Argv = Field(default_factory=list, description="argv appended to command when a checkpoint exists")


class ExitCodes(_Strict):
    preempted: list[int] = Field(default_factory=lambda: [75])
    bad_input: list[int] = Field(default_factory=lambda: [65])


class Plot(_Strict):
    x: str
    y: str
    title: str = ""


class Report(_Strict):
    section: str = Field("", pattern=r"^$|^[a-z_]+$",
                         description="built-in payloads only: the upwell.results.figures module that aggregates shards")
    table: list[str] = Field(default_factory=list, description="metrics shown in the job's table")
    plots: list[Plot] = Field(default_factory=list, description="a metric against a parameter")


class Definition(_Strict):
    """A payload definition (schema version 1)."""

    schema_version: Literal[1] = Field(SCHEMA_VERSION, alias="schema")
    name: str = Field(..., pattern=NAME)
    version: str = Field(..., pattern=r"^[0-9A-Za-z][0-9A-Za-z.+-]{0,63}$")
    description: str = Field("", max_length=4000)
    owner: str = Field(..., min_length=1, max_length=200)
    image: str = Field(..., pattern=DIGEST.pattern, description="registry/repository@sha256:<digest>")
    module: str = Field("", pattern=r"^$|^workers\.payloads\.[a-z_]+$",
                        description="built-in Python payloads only: the worker module {python} -m runs")
    command: Argv = Field(..., min_length=1)
    params: dict[str, Param] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict,
                                  description="work-dir file -> text template, written before prepare runs")
    prepare: list[Argv] = Field(default_factory=list, description="argv steps run before command, in order")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables for every step")
    version_command: Argv = Field(default_factory=list,
                                  description="argv that prints the tool's version (e.g. [gmx, --version]); run "
                                              "once per node and definition, recorded in each result's provenance")
    launcher: Launcher = Launcher()
    resources: Resources = Resources()
    pool: str = Field("cpu", pattern=r"^[a-z][a-z0-9-]{0,30}$")
    input: InputSpec = InputSpec()
    outputs: Outputs = Outputs()
    checkpoint: Checkpoint = Checkpoint()
    exit_codes: ExitCodes = ExitCodes()
    report: Report = Report()
    reduce: ReduceSpec | None = Field(None, description="the analysis run once over every job of this payload "
                                                        "after its last shard; a manifest's own reduce: overrides it")
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("params")
    @classmethod
    def _param_names(cls, v: dict[str, Param]) -> dict[str, Param]:
        for key in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", key) or key in BUILTINS:
                raise ValueError(f"param name {key!r} must be an identifier and not one of {sorted(BUILTINS)}")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.fullmatch(r"[A-Z_][A-Z0-9_]{0,63}", key):
                raise ValueError(f"environment variable name {key!r} must be upper-case letters, digits and _")
        return v

    def relative_paths(self) -> dict[str, str]:
        """Every work-dir path and glob in the file, by its path in the file (each must stay inside)."""
        out = {f"files.{k}": k for k in self.files}
        out["input.path"] = self.input.path
        out.update({f"outputs.artifacts[{i}]": g for i, g in enumerate(self.outputs.artifacts)})
        out.update({f"checkpoint.files[{i}]": g for i, g in enumerate(self.checkpoint.files)})
        out.update({f"checkpoint.keep[{i}]": g for i, g in enumerate(self.checkpoint.keep)})
        if self.outputs.metrics_json:
            out["outputs.metrics_json"] = self.outputs.metrics_json
        out.update({f"outputs.post[{i}].metrics_json": p.metrics_json for i, p in enumerate(self.outputs.post)
                    if p.metrics_json})
        return out

    @property
    def digest(self) -> str:
        return "sha256:" + self.image.rsplit("@sha256:", 1)[1]

    def argvs(self) -> dict[str, Argv]:
        """Every argv template, by its path in the file."""
        out = {"command": self.command, "checkpoint.resume": self.checkpoint.resume,
               "checkpoint.verify": self.checkpoint.verify, "version_command": self.version_command,
               "launcher.mpiexec": self.launcher.mpiexec, "launcher.torchrun": self.launcher.torchrun}
        out.update({f"prepare[{i}]": a for i, a in enumerate(self.prepare)})
        out.update({f"outputs.post[{i}].command": p.command for i, p in enumerate(self.outputs.post)})
        return out


def placeholders(text: str) -> list[str]:
    """The placeholder names in one template string (``{{``/``}}`` are literal braces)."""
    return PLACEHOLDER.findall(text.replace("{{", "").replace("}}", ""))


_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")


def render(template: str, values: dict[str, str]) -> str:
    """Substitute placeholders in one string; the result is one argv element (never split, never shell)."""
    return _TOKEN.sub(lambda m: "{" if m.group(0) == "{{" else "}" if m.group(0) == "}}" else values[m.group(1)],
                      template)


def argv_text(value) -> str:
    """How a param value appears in an argv element or a file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def registry_of(image: str) -> str:
    """The registry host of an image reference (Docker's rule: a first part with '.' or ':', or localhost)."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def registry_allowed(image: str, allowlist: tuple[str, ...]) -> bool:
    host = registry_of(image)
    return any(fnmatch.fnmatchcase(host, pattern) for pattern in allowlist)


def content_hash(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
