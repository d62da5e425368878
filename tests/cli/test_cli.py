"""`chatpage ask` and `chatpage personas` end to end (tiny model; the real one in one case)."""

from __future__ import annotations

import io
import sys

import pytest

from chatpage.cli.main import main


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def no_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", _Tty(""))


@pytest.mark.slow  # the real default model
def test_ask_streams_the_default_models_answer(no_stdin, capsys):
    assert main(["ask", "What is the capital of France?", "--max-tokens", "16"]) == 0
    assert "Paris" in capsys.readouterr().out


def test_ask_reads_piped_context(monkeypatch, capsys, tiny_llama_dir):
    from chatpage.engine.text import chat_template as conversation

    seen = {}

    original = conversation.render_prompt

    def spy(tokenizer, messages, add_generation_prompt=True):
        seen["messages"] = messages
        return original(tokenizer, messages, add_generation_prompt)

    monkeypatch.setattr(conversation, "render_prompt", spy)
    monkeypatch.setattr(sys, "stdin", io.StringIO("def f(x):\n    return x * 2\n"))
    assert main(["ask", "review this", "--model", str(tiny_llama_dir), "--max-tokens", "4"]) == 0
    user = seen["messages"][-1]["content"]
    assert user.startswith("def f(x):") and user.endswith("review this")


def test_ask_runs_on_an_int8_kv_cache(monkeypatch, no_stdin, capsys, tiny_llama_dir):
    """--kv-cache-dtype int8 reaches the engine: it measures int8 on the model, then answers."""
    from chatpage.engine.model import kv_check

    measured = []
    original = kv_check.int8_loss

    def spy(model, ids, block_size, base):
        measured.append(original(model, ids, block_size, base))
        return measured[-1]

    monkeypatch.setattr(kv_check, "int8_loss", spy)
    args = ["ask", "hello", "--model", str(tiny_llama_dir), "--max-tokens", "4"]
    assert main([*args, "--kv-cache-dtype", "int8", "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() and "error" not in captured.err
    assert len(measured) == 1 and measured[0].acceptable


@pytest.mark.parametrize("flag,label", [("--n", "sample"), ("--beam", "beam")])
def test_ask_prints_alternatives_with_scores(flag, label, no_stdin, capsys, tiny_llama_dir):
    args = [
        "ask",
        "hello",
        "--model",
        str(tiny_llama_dir),
        "--max-tokens",
        "5",
        flag,
        "3",
        "--temperature",
        "0.8",
        "--seed",
        "1",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert [line.split(" (")[0] for line in out.splitlines() if line.startswith("---")] == [
        f"--- {label} 1",
        f"--- {label} 2",
        f"--- {label} 3",
    ]
    assert "logprob" in out


@pytest.mark.parametrize(
    "extreme", [["--temperature", "1e-40"], ["--temperature", "0.8", "--top-p", "1e-300"]]
)
def test_ask_with_extreme_sampling_values_answers_as_their_limit(
    extreme, no_stdin, capsys, tiny_llama_dir
):
    """A temperature too small to divide by is greedy; a top-p below float32's range keeps the
    top token (issue 20, item 1): the greedy answer, no traceback."""
    base = ["ask", "hello", "--model", str(tiny_llama_dir), "--max-tokens", "5"]
    assert main([*base, "--temperature", "0"]) == 0
    greedy = capsys.readouterr().out
    assert main([*base, *extreme]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "error" not in captured.err
    assert captured.out == greedy


@pytest.mark.parametrize(
    "args,message",
    [
        (["--temperature", "-1"], "SamplingParams.temperature must be a number >= 0"),
        (["--model", "/no/such/model"], "model path not found: /no/such/model"),
        (["--persona", "nobody"], "no persona named 'nobody'"),
        (["--kv-cache", "64KiB"], "raise the KV cache size"),
    ],
)
def test_ask_bad_input_is_one_clear_line(args, message, no_stdin, capsys, tiny_llama_dir):
    if "--model" not in args:
        args = args + ["--model", str(tiny_llama_dir)]
    assert main(["ask", "hi", *args]) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert len(errors) == 1 and message in errors[0]


def test_personas_lists_shipped_and_reports_broken(capsys, tmp_path, monkeypatch):
    broken = tmp_path / "config" / "chatpage" / "personas"
    broken.mkdir(parents=True)
    (broken / "bad.yaml").write_text("name: bad\ndescription: x\n")
    assert main(["personas"]) == 1
    captured = capsys.readouterr()
    assert "assistant" in captured.out and "coder" in captured.out
    assert "bad.yaml" in captured.err and "system_prompt" in captured.err


@pytest.mark.parametrize("command", [["ask", "q"], ["serve"], ["config"]])
def test_a_global_option_before_a_command_stands(command):
    """`chatpage --model X ask ...` runs X (the command's own --model, unset, used to put None
    over it); given after the command too, the later one wins."""
    from chatpage.cli.main import build_parser

    parser = build_parser()
    args = parser.parse_args(["--model", "a.gguf", "--threads", "3", *command])
    assert (args.model, args.threads) == ("a.gguf", 3)
    if command[0] != "config":
        args = parser.parse_args(
            ["--model", "a.gguf", command[0], "--model", "b.gguf", *command[1:]]
        )
        assert args.model == "b.gguf"


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ({}, "- 1000"),
        ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE -"),
        ({"GOMP_SPINCOUNT": "0"}, "- 0"),
    ],
)
def test_openmp_threads_spin_briefly_while_they_wait_unless_told(given, want):
    """chatpage's processes make OpenMP's waiting threads spin 1000 times before they sleep
    (long spins collapse a busy 2-core machine's steps, sleeping at once slows a quiet one's),
    set before torch loads OpenMP; a wait policy or spin count already set is kept."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(given)
    script = (
        "import chatpage, os, sys; e = os.environ; print(e.get('OMP_WAIT_POLICY', '-'),"
        " e.get('GOMP_SPINCOUNT', '-'), 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [*want.split(), "False"]  # set before anything loaded torch


@pytest.mark.slow  # a process loading a model
def test_ask_stats_come_on_a_line_of_their_own_after_the_answer(tiny_llama_dir):
    """On a terminal stdout and stderr share the screen: the --stats line follows the answer's
    own line end, so an answer cut by --max-tokens does not run into it."""
    import subprocess

    args = ["ask", "hello", "--model", str(tiny_llama_dir), "--max-tokens", "6", "--stats"]
    run = subprocess.run(
        [sys.executable, "-u", "-m", "chatpage.cli", *args, "--kv-disk", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=True,
    )
    lines = run.stdout.splitlines()
    assert lines[-1].startswith("chatpage: 6 tokens"), run.stdout
    assert lines[-2].strip() and "chatpage:" not in lines[-2]  # the answer, ended before it


@pytest.mark.slow  # two processes, each loading a model
def test_ask_speculates_and_answers_the_same_with_it_off(tiny_llama_dir):
    """The `chatpage ask` process, as a user runs it, with --speculate auto and off: the same
    greedy answer, and --stats shows the drafts kept (the tiny model's answer repeats itself:
    its own output is the draft). No disk tier: each run prefills the prompt cold."""
    import re
    import subprocess

    question = "tell me about paging " * 3
    runs = {}
    for mode in ("auto", "off"):
        args = ["ask", question, "--model", str(tiny_llama_dir), "--weights", "int4"]
        args += ["--max-tokens", "40", "--kv-disk", "0", "--stats", "--speculate", mode]
        runs[mode] = subprocess.run(
            [sys.executable, "-m", "chatpage.cli", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=True,
        )
    assert runs["auto"].stdout == runs["off"].stdout and runs["auto"].stdout.strip()
    drafts = re.search(r"· drafts (\d+)/(\d+) accepted$", runs["auto"].stderr, re.M)
    assert drafts is not None and 0 < int(drafts[1]) <= int(drafts[2])
    assert "40 tokens" in runs["off"].stderr and "drafts" not in runs["off"].stderr
