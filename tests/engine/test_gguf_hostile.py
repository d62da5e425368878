"""Hostile GGUF files: each refused in one line before anything is allocated from its sizes, the
rotary tables sized by what the KV pool holds rather than the file's context length, and a
`/model` switch to such a file leaves the chats running (files written with gguf-py's writer,
their metadata overridden, or their header bytes patched)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from gguf_files import Q, write_gguf
from helpers import alpha_and_beta, idle, ready, send, wait_for

from chatpage.config.settings import Settings
from chatpage.engine.client import EngineConfig
from chatpage.engine.llm_engine import LLMEngine
from chatpage.engine.load.loader import ModelLoadError, load_model
from chatpage.engine.sampling_params import SamplingParams
from chatpage.ui.app import ChatApp

gguf = pytest.importorskip("gguf")
V = gguf.GGUFValueType
BIG = 2**31 - 1


def hostile(path: Path, monkeypatch, arch: str = "qwen2", **meta: tuple[object, object]) -> Path:
    """`write_gguf`'s tiny model with the metadata ``meta`` (key -> (value, GGUF value type))
    written over what the writer was given."""
    original = gguf.GGUFWriter.write_header_to_file

    def write_header(writer, *args, **kwargs):
        for key, (value, vtype) in meta.items():
            writer.kv_data[0][key.replace("__", ".")] = gguf.GGUFValue(value, vtype)
        return original(writer, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(gguf.GGUFWriter, "write_header_to_file", write_header)
        return write_gguf(path, Q.F32, arch=arch)


def refusal(path: Path) -> str:
    with pytest.raises(ModelLoadError) as caught:
        load_model(path, progress=lambda _m: None)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("meta", "said"),
    [
        ({"qwen2.block_count": (BIG, V.UINT32)}, "block_count is 2147483647 but the file has"),
        ({"qwen2.block_count": (2, V.UINT32)}, "blk.0 to blk.1 must each be there"),
        ({"qwen2.embedding_length": (BIG, V.UINT32)}, "token_embd.weight is [259, 256]"),
        ({"qwen2.attention.head_count": (0, V.UINT32)}, "head_count must be a whole number"),
        ({"qwen2.attention.head_count_kv": (3, V.UINT32)}, "4 attention heads do not split"),
        ({"qwen2.attention.key_length": (BIG, V.UINT32)}, "blk.0.attn_q.weight is [256, 256]"),
        ({"qwen2.feed_forward_length": (100, V.UINT32)}, "ffn_gate.weight is [512, 256]"),
        ({"qwen2.vocab_size": (BIG, V.UINT32)}, "token_embd.weight is [259, 256]"),
        ({"qwen2.context_length": ("long", V.STRING)}, "context_length must be a whole number"),
        ({"qwen2.context_length": (0, V.UINT32)}, "of at least 1, not 0"),
        ({"qwen2.rope.freq_base": (-1.0, V.FLOAT32)}, "freq_base must be a number above 0"),
        ({"general.alignment": (0, V.UINT32)}, "general.alignment must be a power of two, not 0"),
        ({"general.alignment": (24, V.UINT32)}, "must be a power of two, not 24"),
        ({"general.architecture": ([1, 2], V.ARRAY)}, "malformed metadata"),
    ],
)
def test_config_values_no_model_has_are_refused_in_one_line(tmp_path, monkeypatch, meta, said):
    path = hostile(tmp_path / "m.gguf", monkeypatch, **meta)
    assert said in refusal(path)


def test_a_layer_missing_from_the_tensor_table_is_named(tmp_path, monkeypatch):
    path = hostile(tmp_path / "m.gguf", monkeypatch, arch="llama")
    data = path.read_bytes()
    name = b"blk.0.ffn_down.weight"
    path.write_bytes(data.replace(name, b"blk.0.ffn_xxxx.weight"))
    assert "has no tensor blk.0.ffn_down.weight, which its config needs" in refusal(path)


def _header(count_at: int, value: int, path: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[count_at : count_at + 8] = struct.pack("<Q", value)
    path.write_bytes(bytes(data))
    return path


def test_counts_that_cannot_fit_in_the_file_are_refused(tmp_path):
    path = write_gguf(tmp_path / "m.gguf")
    assert "the tensor count 4611686018427387904 does not fit" in refusal(_header(8, 2**62, path))
    path = write_gguf(tmp_path / "m.gguf")
    assert "the metadata key count 1099511627776 does not fit" in refusal(_header(16, 2**40, path))
    # the first key's length
    assert "a string of length" in refusal(_header(24, 2**63, write_gguf(tmp_path / "m.gguf")))


def _raw_gguf(path: Path, kv: bytes, n_kv: int, tensors: bytes = b"", n_tensors: int = 0) -> Path:
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kv + tensors)
    return path


def _key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


def test_deeply_nested_arrays_and_dimensions_are_refused(tmp_path):
    deep = b"".join(struct.pack("<IQ", V.ARRAY, 1) for _ in range(5000))
    kv = _key("x") + struct.pack("<I", V.ARRAY) + deep + struct.pack("<IQI", V.UINT32, 1, 7)
    assert "metadata arrays nest deeper than 8 levels" in refusal(
        _raw_gguf(tmp_path / "deep.gguf", kv, 1)
    )
    dims = _key("t") + struct.pack("<I", 5000) + struct.pack("<Q", 1) * 5000
    message = refusal(_raw_gguf(tmp_path / "dims.gguf", b"", 0, dims + b"\0" * 12, 1))
    assert "tensor 't' has 5000 dimensions (1 to 4 are)" in message
    huge = struct.pack("<IQ", V.UINT32, 2**62)  # an array of 2**62 numbers
    assert "an array of length 4611686018427387904 does not fit" in refusal(
        _raw_gguf(tmp_path / "long.gguf", _key("x") + struct.pack("<I", V.ARRAY) + huge, 1)
    )


@pytest.mark.parametrize("context", [2**20, BIG])
def test_the_rotary_tables_cover_what_the_pool_holds(tmp_path, monkeypatch, context):
    """A file's context length (2**31 - 1 would be tables of many GiB) is the engine's limit on
    a request, but its tables cover only the positions a sequence can reach in the pool."""
    path = hostile(tmp_path / "m.gguf", monkeypatch, qwen2__context_length=(context, V.UINT32))
    config = EngineConfig(kv_cache_bytes=1 << 20)
    engine = LLMEngine.from_pretrained(str(path), config, progress=lambda _m: None)
    reach = engine.bm.pool.num_blocks * config.block_size
    assert engine.max_model_len == context
    assert engine.model.max_positions == reach < context
    assert engine.model.cos is not None and engine.model.cos.shape[0] == reach
    # a prompt past the pool's reach: still rotated by its own positions
    [out] = engine.generate([[7] * (reach - 8)], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 4


def test_where_every_layer_frees_its_blocks_the_tables_stay_within_the_pool(tmp_path, monkeypatch):
    """Sliding layers that free their blocks do not bound a sequence by the pool: there the
    context is capped (with a warning) so that the rotary tables are no larger than the pool."""
    path = hostile(
        tmp_path / "m.gguf",
        monkeypatch,
        arch="llama",
        llama__context_length=(BIG, V.UINT32),
        llama__attention__sliding_window=(32, V.UINT32),
    )
    config = EngineConfig(kv_cache_bytes=1 << 20)
    engine = LLMEngine.from_pretrained(str(path), config, progress=lambda _m: None)
    assert engine.model.windows == [32]
    assert engine.model.max_positions == engine.max_model_len < BIG
    cos = engine.model.cos
    assert cos is not None and 2 * cos.numel() * cos.element_size() <= config.kv_cache_bytes
    assert any("rotary tables would outweigh the KV cache" in w for w in engine.warnings)
    [out] = engine.generate([[7] * 100], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 4


@pytest.mark.slow
async def test_switching_to_a_hostile_file_leaves_the_chats_running(
    tmp_path, monkeypatch, tiny_llama_dir
):
    path = hostile(tmp_path / "evil.gguf", monkeypatch, qwen2__block_count=(BIG, V.UINT32))
    app = ChatApp(
        model=str(tiny_llama_dir),
        config=EngineConfig(kv_cache_bytes=8 << 20),
        settings=Settings(default_persona="alpha"),
        personas_dirs=[alpha_and_beta(tmp_path)],
    )
    async with app.run_test(size=(140, 44)) as pilot:
        await ready(pilot, app)
        session, client = app.chat.current, app.client
        await send(pilot, f"/model {path}")
        await wait_for(pilot, lambda: "could not switch" in " ".join(app.notices), "the refusal")
        notice = next(n for n in app.notices if "could not switch" in n)
        assert "block_count is 2147483647" in notice and "is still serving" in notice
        assert app.client is client and client.ready
        await send(pilot, "still there?")
        await wait_for(pilot, lambda: idle(app) and len(session.entries) == 2, "the reply")
        assert session.entries[-1].status == "done", session.entries[-1].error
