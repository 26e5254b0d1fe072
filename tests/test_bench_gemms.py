"""harness.bench_gemms: the step's GEMMs, cuBLASLt's problem bookkeeping, the figures of a document
and its report, and the options, on a real document of the tool (tiny shapes, one H200)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from harness import bench_gemms
from harness.config import get_config
from harness.reports.gemms import answer, markdown
from harness.timing import gemms
from harness.timing.cublaslt import OP_N, OP_T, Operand, gemm_problem, operand_layout, transposes
from harness.timing.flops import forward_flops

DOC = Path(__file__).parent / "data" / "bench-gemms-tiny-h200.json"


def _doc() -> dict:
    return json.loads(DOC.read_text())


@pytest.mark.parametrize("model", ["tiny", "small", "large", "2.7B"])
@pytest.mark.parametrize("batch, ctx", [(1, 64), (32, 1024)])
def test_the_problems_are_the_step_s_dense_flops(model, batch, ctx) -> None:
    """Every linear layer's three GEMMs, weighed by how often each runs, are the step's FLOPs less
    the attention products: three times the forward's dense part (`harness.timing.flops`)."""
    config = get_config(model)
    attention = config.num_layers * 2 * (2 * batch * ctx * ctx * config.d_model)
    dense_forward = forward_flops(config, batch, ctx) - attention
    problems = gemms.gemm_problems(config, batch, ctx)
    assert sum(g.flops * g.per_step for g in problems) == 3 * dense_forward
    assert len(problems) == len(gemms.LAYERS) * len(gemms.PASSES)


def test_the_problems_of_large_at_batch_32() -> None:
    by = {g.key: (g.m, g.n, g.k, g.per_step) for g in gemms.gemm_problems(get_config("large"), 32, 1024)}
    assert by["w1/w3 fwd"] == (32768, 5120, 1280, 72)
    assert by["w1/w3 dgrad"] == (32768, 1280, 5120, 72)
    assert by["w1/w3 wgrad"] == (5120, 1280, 32768, 72)
    assert by["w2 fwd"] == (32768, 1280, 5120, 36)
    assert by["q/k/v/o wgrad"] == (1280, 1280, 32768, 144)
    assert by["lm_head fwd"] == (32768, 10000, 1280, 1)


def _column_major(memory: np.ndarray, rows: int, cols: int, ld: int) -> np.ndarray:
    """The rows x cols column-major matrix with leading dimension ld over flat `memory`."""
    return np.stack([memory[j * ld: j * ld + rows] for j in range(cols)], axis=1)


@pytest.mark.parametrize("pass_name", ["fwd", "dgrad", "wgrad"])
def test_the_column_major_problem_computes_the_row_major_product(pass_name) -> None:
    """cuBLASLt's problem, evaluated as cuBLAS defines it (op(A) op(B), column-major, D of ld n),
    gives a @ b for each pass's operands as the layer holds them (transposed views included)."""
    rng = np.random.default_rng(0)
    tokens, n_in, n_out = 6, 4, 5
    x, w, g = rng.normal(size=(tokens, n_in)), rng.normal(size=(n_out, n_in)), rng.normal(size=(tokens, n_out))
    a, b = {"fwd": (x, w.T), "dgrad": (g, w), "wgrad": (g.T, x)}[pass_name]
    la = operand_layout(a.shape, tuple(s // a.itemsize for s in a.strides))
    lb = operand_layout(b.shape, tuple(s // b.itemsize for s in b.strides))
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    opa, opb, M, N, K, ar, ac, lda, br, bc, ldb = gemm_problem(la, lb, m, n, k)
    memory_a = np.ascontiguousarray(b.base if b.base is not None else b).ravel()  # cuBLASLt's A is b's memory
    memory_b = np.ascontiguousarray(a.base if a.base is not None else a).ravel()
    A = _column_major(memory_a, ar, ac, lda)
    B = _column_major(memory_b, br, bc, ldb)
    A, B = (A.T if opa == OP_T else A), (B.T if opb == OP_T else B)
    assert A.shape == (M, K) and B.shape == (K, N)
    d = A @ B  # column-major D, M x N = n x m: the row-major product's transpose
    np.testing.assert_allclose(d.T, a @ b, rtol=1e-12)
    assert transposes((opa, opb)) == {"fwd": "TN", "dgrad": "NN", "wgrad": "NT"}[pass_name]


def test_a_layout_cublaslt_cannot_read_is_none() -> None:
    assert operand_layout((4, 6), (6, 1)) == Operand(OP_N, 6, 4, 6)  # row-major: already the transpose
    assert operand_layout((4, 6), (8, 1)) == Operand(OP_N, 6, 4, 8)  # rows padded to 8
    assert operand_layout((4, 6), (1, 4)) == Operand(OP_T, 4, 6, 4)  # column-major: transposed by the op
    assert operand_layout((4, 6), (12, 2)) is None


def test_the_transposes_recorded_are_the_ones_cublas_names_its_kernels_by() -> None:
    """cuBLAS's nvjet kernels end in their A, B and D transposes: every candidate of the document
    carries the two letters the bookkeeping gave its problem."""
    for p in _doc()["problems"]:
        for c in p["candidates"]:
            assert c["kernel"].split(" + ")[0].rsplit("_", 1)[-1][:2] == p["transposes"], (p["layer"], c)


def test_every_candidate_computed_the_product_torch_did() -> None:
    """Within a bf16 rounding of the largest output (2^-7 of it: the same float32 sums rounded
    once, or split-K's partial sums added in another order)."""
    for p in _doc()["problems"]:
        assert all(c["max_rel_diff"] <= 2 ** -7 for c in p["candidates"]), p["layer"]


def test_summarize_takes_medians_over_the_rounds_and_weighs_them_by_the_step() -> None:
    doc = _doc()
    s = gemms.summarize(doc)
    for p, row in zip(doc["problems"], s["rows"]):
        times = {name: [r[name]["us"] for r in p["rounds"]] for name in p["rounds"][0]}
        assert row["mm"]["median"] == statistics.median(times["mm"])
        candidates = [k for k in times if k not in ("mm", "xla_call")]
        fastest = min(candidates, key=lambda k: statistics.median(times[k]))
        assert row["best"]["candidate"] == int(fastest)
        if p["xla"]["kind"] == "cublaslt":
            assert row["xla"]["median"] == statistics.median(times[str(p["xla"]["candidate"])])
        else:
            assert row["xla"]["median"] == statistics.median(times["xla_call"])
        assert row["xla_over_mm"] == row["xla"]["median"] / row["mm"]["median"]
    assert s["step_ms"]["mm"] == pytest.approx(
        sum(statistics.median([r["mm"]["us"] for r in p["rounds"]]) * p["per_step"] for p in doc["problems"]) / 1e3,
        rel=1e-12)
    fastest = [min(statistics.median([r[k]["us"] for r in p["rounds"]]) for k in p["rounds"][0]
                   if k not in ("mm", "xla_call")) for p in doc["problems"]]
    assert s["step_ms"]["best"] == pytest.approx(
        sum(t * p["per_step"] for t, p in zip(fastest, doc["problems"])) / 1e3, rel=1e-12)


def test_torch_s_kernel_is_matched_to_its_candidate_by_name() -> None:
    doc = _doc()
    rows = gemms.summarize(doc)["rows"]
    for p, row in zip(doc["problems"], rows):
        names = [c["kernel"] for c in p["candidates"]]
        expected = p["candidates"][names.index(p["torch_kernel"])]["index"] if p["torch_kernel"] in names else None
        assert row["mm"]["candidate"] == expected
    assert gemms.summarize(doc)["mm_first"] == sum(r["mm"]["candidate"] == 0 for r in rows)


def test_the_report_opens_with_its_answer_in_the_document_s_figures() -> None:
    doc = _doc()
    s = gemms.summarize(doc)
    text = markdown(doc)
    lines = text.splitlines()
    assert lines[0].startswith("# ") and lines[2] == answer(doc)[0]
    t, x = s["step_ms"]["mm"], s["step_ms"]["xla"]
    assert f"{t:.1f} ms with torch's kernels and {x:.1f} ms with XLA's choices ({x / t:.3f}x)" in text
    assert f"first candidate in {s['mm_first']} of {len(s['rows'])} GEMMs" in text
    assert text.count("\n| ") == len(doc["problems"]) + 1  # header and one row per GEMM


def test_an_interrupted_document_says_so_and_keeps_its_rows() -> None:
    doc = _doc()
    doc["problems"] = doc["problems"][:2]
    doc["interrupted"] = "stopped by SIGTERM; finished: q/k/v/o fwd, q/k/v/o dgrad"
    text = markdown(doc)
    assert "Interrupted: stopped by SIGTERM" in text and text.count("\n| q/k/v/o") == 2


def test_xla_choice_reads_the_selected_algorithm_of_the_custom_call() -> None:
    line = ('  %custom-call.1 = (bf16[32768,5120]{1,0}, s8[33554432]{0}) custom-call(%x.1, %w.1), '
            'custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"alpha_real":1,'
            '"epilogue":"DEFAULT","selected_algorithm":"7"},"operation_queue_id":"0"}')
    assert gemms.xla_choice("HloModule m\n" + line + "\n") == {"kind": "cublaslt", "candidate": 7}
    fusion = ("HloModule m\nENTRY %main {\n  ROOT %gemm_fusion_dot.1 = bf16[128,512]{1,0} fusion(%a, %b), "
              "kind=kCustom, calls=%gemm_fusion_dot_computation\n}\n")
    assert gemms.xla_choice(fusion) == {"kind": "other", "op": "gemm_fusion_dot.1"}


def test_render_writes_the_report_beside_the_document(tmp_path, capsys) -> None:
    path = tmp_path / "g.json"
    path.write_text(DOC.read_text())
    assert bench_gemms.main(["--render", str(path)]) == 0
    assert path.with_suffix(".md").read_text() == markdown(_doc())


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    return err[0]


def test_bad_input_is_one_line_before_any_work(tmp_path, capsys, monkeypatch) -> None:
    assert bench_gemms.main(["--render", str(tmp_path / "none.json")]) == 2
    assert "--render" in _one_line(capsys)
    assert bench_gemms.main(["--render", str(DOC), "--rounds", "2"]) == 2
    assert "--rounds" in _one_line(capsys)
    assert bench_gemms.main(["--out", str(tmp_path / "g.txt")]) == 2
    assert ".json" in _one_line(capsys)
    taken = tmp_path / "taken.json"
    taken.write_text("{}")
    assert bench_gemms.main(["--out", str(taken)]) == 2
    assert "--overwrite" in _one_line(capsys)
    monkeypatch.setattr(bench_gemms, "gpu_available", lambda: False)
    assert bench_gemms.main(["--out", str(tmp_path / "g.json")]) == 2
    assert "no CUDA GPU" in _one_line(capsys)
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize("stop, code, said", [(KeyboardInterrupt("SIGTERM"), 130, "stopped by"),
                                              (RuntimeError("cuBLASLt heuristic failed with status 7"), 1, "failed:")])
def test_a_stop_or_a_failure_keeps_the_gemms_that_finished(stop, code, said, tmp_path, capsys, monkeypatch) -> None:
    """The document and its report hold the GEMMs measured before the stop, and say where it stopped."""
    from harness.timing import cublaslt

    finished = _doc()["problems"][:2]

    def measure(problems, rounds, seconds, say, done):
        done.extend(finished)
        raise stop

    import torch

    monkeypatch.setattr(bench_gemms, "gpu_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H200")
    monkeypatch.setattr(cublaslt, "version", lambda: 130100)
    monkeypatch.setattr(gemms, "measure", measure)
    out = tmp_path / "g.json"
    assert bench_gemms.main(["--model", "tiny", "--ctx", "64", "--batch", "2", "--out", str(out)]) == code
    doc = json.loads(out.read_text())
    assert doc["problems"] == finished and said in doc["interrupted"]
    assert "Interrupted: " + doc["interrupted"] in out.with_suffix(".md").read_text()
    assert "the finished GEMMs are kept" in capsys.readouterr().err
