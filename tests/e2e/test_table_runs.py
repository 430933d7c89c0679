"""`miro run` of a Parquet file end to end (a tiny model): the rows in order, their own columns kept with their
types, a bad row named and kept as a failed row under --skip-invalid."""

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from miro.cli.main import cli


def test_a_parquet_dataset_runs_with_its_columns_kept_in_order(tmp_path, tiny_model):
    dataset = tmp_path / "reviews.parquet"
    pq.write_table(
        pa.table(
            {
                "review_id": ["r3", "r1", "r2", "r9"],
                "text": ["good", "bad", None, "fine"],
                "stars": [5, 1, 3, 4],
                "tags": [["a"], [], ["b", "c"], None],
            }
        ),
        dataset,
    )
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(
        cli,
        [
            "run",
            str(dataset),
            "-o",
            str(out),
            "--model",
            tiny_model,
            "--kv-cache-memory",
            "8MiB",
            "--template",
            "Review: {text}",
            "--id-column",
            "review_id",
            "--max-tokens",
            "3",
            "--temperature",
            "0",
            "--skip-invalid",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "row 3: column 'text' is null, and the template needs it." in result.output
    table = pq.read_table(out)
    assert table.column("custom_id").to_pylist() == ["r3", "r1", "line-3", "r9"]
    assert table.column("prompt").to_pylist()[:2] == ["Review: good", "Review: bad"]
    assert table.column("stars").to_pylist() == [5, 1, None, 4]  # the invalid row keeps no fields of its own
    assert table.schema.field("stars").type == pa.int64()
    assert table.column("tags").to_pylist() == [["a"], [], None, None]
    assert table.column("text").to_pylist() == ["good", "bad", None, "fine"]
    errors = table.column("error").to_pylist()
    assert errors[2] is not None and [e for i, e in enumerate(errors) if i != 2] == [None] * 3
