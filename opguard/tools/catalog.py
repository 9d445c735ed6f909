"""Every tool OpGuard offers coding agents, in the order an agent would use them. Adding a tool
is one entry here (its handler is imported only when it is called)."""

from __future__ import annotations

from ..record_options import declared
from ..tool_registry import MAX_CHARS, Param, Tool

RUN_A = Param("run_a", "string", "run directory of run A (the reference)", required=True)
RUN_B = Param("run_b", "string", "run directory of run B", required=True)
RUN = Param("run", "string", "a run directory", required=True)
INDEX = Param("index", "integer", "op index, #N in other answers", required=True, minimum=0)
SIDE = Param("side", "string", "the run INDEX is in", "--side", default="a", choices=("a", "b"))
RANK = Param("rank", "integer", "rank (default: the lowest recorded)", "--rank", minimum=0)
# explain's settings are checked where every source of them is (flags, environment, config).
STEP = Param("step", "integer", "compare only this step", "--step", minimum=0)
PAIR = (RUN_A, RUN_B, INDEX, SIDE, RANK)
TOLERANT = Param(
    "tolerant",
    "string",
    "runs expected to differ by rounding (another torch, GPU, TF32, bf16): 'auto' "
    "(--tolerant alone) names the first difference rounding does not explain, a relative "
    "distance REL such as '1e-3' (--tolerant=1e-3) the first larger than that (default: bit "
    "for bit)",
    "--tolerant",
    bare="auto",  # the rule (analysis.tolerant.rule.Mode)
    metavar="REL",
)
NOISE = Param(
    "noise",
    "string",
    "with tolerant 'auto': a control run of run A's script whose rounding was perturbed "
    "(opguard record --perturb-rounding SEED, another thread count): a difference within "
    "8x the control's distance from run A at that op is rounding too",
    "--noise",
    metavar="CONTROL",
)
RAY = Param(
    "ray",
    "string",
    "compare on a Ray cluster, each rank on the node holding its traces: the cluster's "
    "address (host:port), or 'auto' (--ray alone: the one RAY_ADDRESS names, else the one "
    "started on this machine); needs pip install 'opguard[ray]' (default: here, a process "
    "per rank)",
    "--ray",
    bare="auto",  # opguard.distributed.driver.AUTO
    metavar="ADDRESS",
)
# The zoom commands (tensor, replay) name run A's op with --op and default to rank 0.
OP = Param(
    "index",
    "integer",
    "op index in run A (record it with --capture)",
    "--op",
    required=True,
    minimum=0,
)
OP_B = Param(
    "op_b", "integer", "op index in run B (default: the one aligned with A's)", "--op-b", minimum=0
)
RANK0 = Param("rank", "integer", "rank", "--rank", default=0, minimum=0)
# `opguard record`'s options, as declared with RecordOptions.
RECORD_OPTIONS = tuple(
    Param(
        f.name,
        switch.kind,
        switch.help,
        switch.flag,
        default=False if switch.kind == "boolean" else None,
        metavar=switch.metavar,
        minimum=switch.minimum,
        maximum=switch.maximum,
    )
    for f, switch in declared()
)
ANSWERS = "opguard.tools"  # the package of every handler

TOOLS: tuple[Tool, ...] = (
    Tool(
        "record",
        "Run a training script (or -m module) under OpGuard and record every op into RUN_DIR.",
        (
            Param("output", "string", "run directory to create", "-o", required=True),
            *RECORD_OPTIONS,
            Param(
                "python", "string", "interpreter to run under (OpGuard installed there)", "--python"
            ),
            Param("module", "string", "run this module (python -m) instead of a script", "-m"),
            Param("script", "string", "the training script", rest=True),
            Param("args", "array", "the script's own arguments", rest=True),
        ),
        f"{ANSWERS}.recording:record",
    ),
    Tool(
        "show",
        "Summarise a recorded run: command, versions, devices, ops and steps per rank, how it ended.",
        (RUN, RANK),
        f"{ANSWERS}.runs:show",
    ),
    Tool(
        "diff",
        "Compare two runs: verdict and the first divergence (op, call site, kind, cause, what differs), counts per step.",
        (
            RUN_A,
            RUN_B,
            RANK,
            STEP,
            TOLERANT,
            NOISE,
            RAY,
            Param(
                "brief",
                "boolean",
                "leave out ops given twice (observed, the origin rank's divergence, "
                "non-finite first_seen, where they are the op beside them)",
                "--brief",
                default=True,
            ),
        ),
        f"{ANSWERS}.answers:diff",
        page=None,
    ),
    Tool(
        "hunt",
        "Long runs: record both at step level, find the first step whose state differs (with tolerant: beyond the rounding envelope), record that step op by op in both and diff: the op and its line (runs both scripts twice).",
        (
            Param(
                "output",
                "string",
                "hunt directory: the recordings and their logs",
                "-o",
                required=True,
            ),
            Param(
                "a", "string", "run A: 'train.py ARGS' or '-m module ARGS'", "--a", required=True
            ),
            Param("b", "string", "run B, as run A", "--b", required=True),
            Param(
                "python", "string", "interpreter to run under (OpGuard installed there)", "--python"
            ),
            Param(
                "overwrite",
                "boolean",
                "replace the run directories of an earlier hunt",
                "--overwrite",
                default=False,
            ),
            TOLERANT,
            NOISE,
            RAY,
        ),
        f"{ANSWERS}.recording:hunt",
        fixed=("--brief",),
    ),
    Tool(
        "ops",
        "Ops around an index in both runs, aligned: A and B index, equal/differing/only in one run, op, call site.",
        (
            *PAIR,
            Param(
                "changed",
                "boolean",
                "only rows that differ or exist in one run",
                "--changed",
                default=False,
            ),
        ),
        f"{ANSWERS}.answers:ops",
        page=20,
    ),
    Tool(
        "op",
        "One op in both runs: call sites, arguments (what differs), inputs and outputs with values, bits, stats, producers.",
        PAIR,
        f"{ANSWERS}.answers:op",
        page=12,
    ),
    Tool(
        "producers",
        "Follow an op's differing input back through the ops that produced it, in both runs, to where the difference starts.",
        (
            *PAIR,
            Param(
                "slot",
                "string",
                "input to follow first (default: the first that differs)",
                "--slot",
            ),
            Param("depth", "integer", "most hops", "--depth", default=8, minimum=1, maximum=64),
        ),
        f"{ANSWERS}.answers:producers",
    ),
    Tool(
        "source",
        "Source lines around an op's call site in one run, and the user stack that led there.",
        (
            RUN,
            INDEX,
            RANK,
            Param(
                "before",
                "integer",
                "lines before the call line",
                "--before",
                default=5,
                minimum=0,
                maximum=20,
            ),
            Param(
                "after", "integer", "lines after it", "--after", default=5, minimum=0, maximum=20
            ),
        ),
        f"{ANSWERS}.answers:source",
    ),
    Tool(
        "kernels",
        "GPU kernels, memcpys and memsets an op launched in one run (name, grid, stream, timing), "
        "and apart, those launched after it by code OpGuard did not record.",
        (RUN, INDEX, RANK),
        f"{ANSWERS}.answers:kernels",
        page=20,
    ),
    Tool(
        "explain",
        "The evidence of the first divergence as text for a model, and the offline rule-based reading; with a model, its answer under a USD budget.",
        (
            RUN_A,
            RUN_B,
            RANK,
            STEP,
            TOLERANT,
            NOISE,
            RAY,
            Param("model", "string", "LiteLLM model string; none: offline reading only", "--model"),
            Param(
                "budget",
                "number",
                "most USD the session may spend (default 0.05)",
                "--budget",
            ),
            Param(
                "max_tokens",
                "integer",
                "most prompt + output tokens in the session",
                "--max-tokens",
            ),
            Param("question", "string", "ask this instead of the default question", "--question"),
        ),
        f"{ANSWERS}.explanation:explain",
        fixed=("--brief",),
    ),
    Tool(
        "tensor",
        "Captured tensors of one op compared element by element: how many differ, by how much (abs, rel, ULPs), where, what the pattern suggests.",
        (
            RUN_A,
            RUN_B,
            OP,
            OP_B,
            RANK0,
            Param("input", "string", "only this input (position or slot name)", "--input"),
            Param("output", "string", "only this output (default: every output)", "--output"),
        ),
        f"{ANSWERS}.zoom:tensor",
    ),
    Tool(
        "replay",
        "Re-run a captured op on its captured inputs N times (every GPU, else CPU, and float64): deterministic? reproduces run A (and B)?",
        (
            Param("run_a", "string", "the run whose captured op is replayed", required=True),
            OP,
            OP_B,
            RANK0,
            Param(
                "times",
                "integer",
                "replays per device",
                "--times",
                default=5,
                minimum=1,
                maximum=100,
            ),
            Param("against", "string", "also compare with this run's aligned op", "--against"),
            Param(
                "device", "string", "only this device (default: every GPU, else cpu)", "--device"
            ),
        ),
        f"{ANSWERS}.zoom:replay",
    ),
    Tool(
        "nan",
        "The first op per rank whose outputs hold NaN or Inf while its inputs did not.",
        (RUN, RANK),
        f"{ANSWERS}.runs:nan",
    ),
)

BY_NAME = {tool.name: tool for tool in TOOLS}

GUIDE = f"""\
OpGuard tools: find where two recorded PyTorch runs stop computing the same thing.
Each tool is a command that prints one JSON object with --json (exit 2 and one line on stderr
for bad input), and the MCP tool of the same name (`opguard mcp`, same arguments by name).
Answers are compact and at most {MAX_CHARS} characters; paged answers take --offset/--limit and
give "next" (null at the end). Op indices (#N) are per run and rank. Relative paths are
relative to the directory the command (or the MCP server) was started in.

Start: record both runs (--steps 3 is usually enough), then diff. Its first_divergence names
op indices a.index / b.index: look at them with op, the ops around them with ops, follow a
differing input with producers, read the code with source. Runs that part late (step 2,000):
hunt finds the step cheaply, then records its ops; read its op_level like diff's answer.
"""
