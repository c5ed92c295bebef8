"""`latentkv export --gguf FOLDER OUT.gguf` from the command line: writes the file, or says why not
(exit status 2)."""

from __future__ import annotations

import gguf

from latentkv.cli import main


def test_export_writes_the_gguf(tiny_lm, tmp_path, capsys):
    folder, _, _ = tiny_lm("v3_moe_sigmoid")
    capsys.readouterr()
    out = tmp_path / "sub" / "m.gguf"
    assert main(["export", "--gguf", str(folder), str(out), "--outtype", "q8_0"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    reader = gguf.GGUFReader(str(out))
    assert reader.fields["general.architecture"].contents() == "deepseek2"
    assert {t.name: t.tensor_type for t in reader.tensors}[
        "blk.1.ffn_down_exps.weight"
    ] == gguf.GGMLQuantizationType.Q8_0


def test_export_errors_say_why_with_status_2(tiny_lm, tmp_path, capsys):
    folder, _, _ = tiny_lm("v2_moe_group_limited")
    capsys.readouterr()
    assert main(["export", "--gguf", str(folder), str(tmp_path / "m.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("latentkv export: error:") and "group_limited_greedy" in err
    assert main(["export", "--gguf", str(tmp_path / "nowhere"), str(tmp_path / "m.gguf")]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert not (tmp_path / "m.gguf").exists()
