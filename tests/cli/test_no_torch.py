"""The commands that only read the store import no torch, for the default representation on BERT too (its vector
ends in the vocabulary head's block, whose size comes from the shapes, not from reading the embeddings); those
that read a stored model's answer import no Hub client either (the console script imports only its command)."""

from __future__ import annotations

import subprocess
import sys

from modelvec import embed

CODE = (
    "import sys\nfrom modelvec.cli import main\nsys.argv = ['modelvec', *sys.argv[1:]]\n"
    "try:\n    main()\nexcept SystemExit as exc:\n    print('exit', exc.code)\nprint('torch' in sys.modules, 'huggingface_hub' in sys.modules)"
)


def test_reading_commands_import_no_torch(tiny_bert, tiny_finetunes, tmp_path):
    store = tmp_path / "s.duckdb"
    result = embed(tiny_bert, tiny_finetunes, store=store, load=False)
    assert result.failed == {}
    commands = {
        "show": ["show"],
        "export": ["export", "--parquet", str(tmp_path / "v.parquet")],
        "cluster": ["cluster", str(tiny_bert), "--reduce", "pca", "--out", str(tmp_path / "map")],
        "neighbors": ["neighbors", str(tiny_finetunes[0]), "--k", "2"],
        "tree": ["tree", str(tiny_bert), "--out", str(tmp_path / "tree")],
    }
    for name, args in commands.items():
        out = subprocess.run(
            [sys.executable, "-c", CODE, *args, "--store", str(store)], capture_output=True, text=True, timeout=300
        )
        lines = out.stdout.strip().splitlines()
        assert out.returncode == 0 and lines[-2] == "exit 0", (name, out.stdout[-800:], out.stderr[-800:])
        torch, hub = lines[-1].split()
        assert torch == "False", f"{name} imported torch"
        assert hub == "False" or name not in ("show", "neighbors"), f"{name} imported huggingface_hub"
