"""Datasets as tables (Parquet, CSV, a saved Hugging Face dataset) and the column options: each row validated as the
simple JSONL line it stands for, its problems naming the row, the whole-file problems one sentence."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from miro.cli.main import cli
from miro.core.errors import MiroError
from miro.worker.fleet.intake.columns import InputColumns
from miro.worker.fleet.intake.dataset import DatasetScan, parse_dataset, scan_dataset
from miro.worker.fleet.intake.inputs import LineError

ROWS = {
    "text": ["Say hi.", "Name a colour.", "Count to three."],
    "category": ["greeting", "colours", "numbers"],
    "score": [0.5, 1.25, 2.0],
    "max_tokens": [4, None, 6],
}


def parquet(tmp_path: Path, columns: dict, name="d.parquet", **kwargs) -> Path:
    path = tmp_path / name
    pq.write_table(pa.table(columns), path, **kwargs)
    return path


def jsonl(tmp_path: Path, lines: list[dict], name="d.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def hf_saved(tmp_path: Path, columns: dict) -> Path:
    """A folder as `datasets.Dataset.save_to_disk` writes it: Arrow stream files that state.json lists."""
    folder = tmp_path / "saved"
    folder.mkdir()
    table = pa.table(columns)
    for index, piece in enumerate((table.slice(0, 2), table.slice(2))):
        with (
            pa.OSFile(str(folder / f"data-{index:05d}-of-00002.arrow"), "wb") as sink,
            pa.ipc.new_stream(sink, table.schema) as writer,
        ):
            writer.write_table(piece)
    (folder / "state.json").write_text(
        json.dumps(
            {
                "_data_files": [{"filename": "data-00000-of-00002.arrow"}, {"filename": "data-00001-of-00002.arrow"}],
                "_fingerprint": "0",
                "_format_type": None,
            }
        )
    )
    (folder / "dataset_info.json").write_text("{}")
    return folder


def as_lines(rows: dict, rename: dict) -> list[dict]:
    """The table's rows as the simple JSONL lines they stand for (a null field left out)."""
    names = list(rows)
    return [
        {rename.get(name, name): value for name, value in zip(names, values) if value is not None}
        for values in zip(*rows.values())
    ]


def test_a_parquet_row_is_the_simple_line_it_stands_for(tmp_path):
    table = parse_dataset(parquet(tmp_path, ROWS), {"temperature": 0.0}, columns=InputColumns(prompt="text"))
    lines = parse_dataset(jsonl(tmp_path, as_lines(ROWS, {"text": "prompt"})), {"temperature": 0.0})
    assert table.ok and lines.ok
    assert table.requests == lines.requests  # the same Request: nothing downstream can tell them apart
    assert [r.custom_id for r in table.requests] == ["line-1", "line-2", "line-3"]
    assert table.requests[0].extra == {"category": "greeting", "score": 0.5}
    assert table.requests[1].sampling["max_tokens"] is None  # a null is "not given"


@pytest.mark.parametrize("maker", ["parquet", "csv", "arrow", "jsonl"])
def test_every_format_gives_the_same_requests(tmp_path, maker):
    rows = {"q": ["a b", "c\nd"], "id": ["x1", "x2"], "temperature": [0.0, 0.7], "stop": [None, "\n"]}
    if maker == "parquet":
        path = parquet(tmp_path, rows)
    elif maker == "csv":
        path = tmp_path / "d.csv"
        path.write_text('q,id,temperature,stop\n"a b",x1,0.0,\n"c\nd",x2,0.7,"""\\n"""\n')
    elif maker == "arrow":
        path = hf_saved(tmp_path, {k: v * 2 for k, v in rows.items()} | {"id": ["x1", "x2", "x3", "x4"]})
    else:
        path = jsonl(tmp_path, as_lines(rows, {}))
    result = parse_dataset(path, columns=InputColumns(prompt="q"))
    assert result.ok, result.errors
    assert [
        (r.custom_id, r.prompt, r.sampling.get("temperature"), r.sampling.get("stop")) for r in result.requests[:2]
    ] == [("x1", "a b", 0.0, None), ("x2", "c\nd", 0.7, ["\n"])]


def test_template_over_columns_and_chat(tmp_path):
    path = parquet(tmp_path, {"title": ["Dune", "Emma"], "year": [1965, 1815]})
    columns = InputColumns(template="Summarise {title} ({year}).", chat=True)
    result = parse_dataset(path, columns=columns)
    assert result.ok
    assert result.requests[0].kind == "chat"
    assert result.requests[0].messages == [{"role": "user", "content": "Summarise Dune (1965)."}]
    assert result.requests[1].extra == {"title": "Emma", "year": 1815}  # the template's columns are kept


def test_a_template_naming_a_missing_column_is_one_sentence(tmp_path):
    path = parquet(tmp_path, ROWS)
    with pytest.raises(
        MiroError,
        match=r"^The template names the column 'txt', which the dataset does not have "
        r"\(did you mean 'text'\?\)\.$",
    ):
        parse_dataset(path, columns=InputColumns(template="Summarise: {txt}"))
    with pytest.raises(MiroError, match="has no column 'body' \\(--prompt-column\\)"):
        parse_dataset(path, columns=InputColumns(prompt="body"))
    with pytest.raises(MiroError, match="placeholder '{text:>9}' is not a column name"):
        InputColumns(template="{text:>9}")


def test_bad_rows_name_their_row(tmp_path):
    path = parquet(
        tmp_path,
        {"text": ["ok", None, "ok too", "t"], "temperature": [0.0, 0.0, -1.0, 0.0], "id": ["a", "b", "c", "a"]},
    )
    result = parse_dataset(path, columns=InputColumns(prompt="text"))
    assert [(e.line, e.message) for e in result.errors] == [
        (2, "row 2: column 'text' is null, and it is the request's prompt."),
        (3, "row 3: temperature must be >= 0, got -1.0."),
        (4, "row 4: duplicate custom id 'a' (first used on row 1)."),
    ]
    assert [r.custom_id for r in result.requests] == ["a"]


def test_a_row_over_the_size_limit_is_its_error(tmp_path):
    path = parquet(
        tmp_path,
        {
            "prompt": ["short", "x" * 1_000_001, "fine"],
            "messages": pa.array(
                [None, None, None], pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
            ),
        },
    )
    result = parse_dataset(path)
    assert [e.message for e in result.errors] == [
        "row 2: the row holds 1,000,001 bytes, over the limit of 1,000,000 bytes."
    ]
    assert [r.prompt for r in result.requests] == ["short", "fine"]


def test_pandas_float_integers_and_csv_text(tmp_path):
    path = parquet(tmp_path, {"prompt": ["a", "b"], "max_tokens": [3.0, float("nan")], "seed": [1.0, 2.5]})
    result = parse_dataset(path)
    assert result.requests[0].sampling["max_tokens"] == 3 and result.requests[0].sampling["seed"] == 1
    assert [e.message for e in result.errors] == [
        "row 2: field 'max_tokens': Input should be a valid integer; field 'seed': Input should be a valid integer."
    ]
    csv = tmp_path / "d.csv"
    csv.write_text("prompt,max_tokens,n,note\nhi,7,2,007\nyo,seven,,\n")
    result = parse_dataset(csv)
    assert (result.requests[0].sampling["max_tokens"], result.requests[0].sampling["n"]) == (7, 2)
    assert result.requests[0].extra == {"note": "007"}  # CSV has no types: its own columns stay text
    assert [e.message for e in result.errors] == ["row 2: field 'max_tokens': Input should be a valid integer."]


def test_whole_file_problems_are_one_sentence(tmp_path):
    clash = parquet(tmp_path, {"prompt": ["a"], "output": ["b"]})
    with pytest.raises(MiroError, match="column 'output' cannot be kept as a column of the results .*rename it"):
        parse_dataset(clash)
    typo = parquet(tmp_path, {"prompt": ["a"], "temprature": [0.1]}, name="t.parquet")
    with pytest.raises(MiroError, match="did you mean 'temperature'"):
        parse_dataset(typo)
    twice = parquet(tmp_path, {"prompt": ["a"], "text": ["b"]}, name="w.parquet")
    with pytest.raises(MiroError, match="has a column 'prompt' besides the request's input \\(--prompt-column 'text'"):
        parse_dataset(twice, columns=InputColumns(prompt="text"))
    binary = parquet(tmp_path, {"prompt": ["a"], "blob": [b"\x00"]}, name="b.parquet")
    with pytest.raises(MiroError, match="column 'blob' holds bytes"):
        parse_dataset(binary)
    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_text('{"prompt": "hi"}\n')
    with pytest.raises(MiroError, match="^Dataset file '.*x.parquet' cannot be read as Parquet"):
        parse_dataset(not_parquet)
    with pytest.raises(MiroError, match="is no dataset saved by Hugging Face datasets"):
        parse_dataset(tmp_path)
    with pytest.raises(MiroError, match="Give one of --prompt-column and --template"):
        InputColumns(prompt="a", template="{b}")


def test_timestamps_and_structs_come_back_as_json_values(tmp_path):
    import datetime

    when = datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.timezone.utc)
    path = parquet(
        tmp_path,
        {"prompt": ["a"], "at": pa.array([when], pa.timestamp("ms", tz="UTC")), "meta": [{"k": 1, "tags": ["x"]}]},
    )
    [request] = parse_dataset(path).requests
    assert request.extra == {"at": "2024-05-01 12:30:00.000Z", "meta": {"k": 1, "tags": ["x"]}}


def test_a_dataset_dict_folder_asks_for_a_split(tmp_path):
    hf_saved(tmp_path, {"prompt": ["a", "b", "c"]}).rename(tmp_path / "train")
    (tmp_path / "dataset_dict.json").write_text('{"splits": ["train"]}')
    with pytest.raises(MiroError, match="holds a DatasetDict of splits \\(train\\): give one split's folder"):
        parse_dataset(tmp_path)
    assert len(parse_dataset(tmp_path / "train").requests) == 3


def test_columns_map_a_jsonl_file_too(tmp_path):
    path = jsonl(tmp_path, [{"question": "why?", "key": 7}, {"question": 3, "key": 8}])
    result = parse_dataset(path, columns=InputColumns(prompt="question", id="key"))
    assert [(r.custom_id, r.prompt) for r in result.requests] == [("7", "why?")]
    assert [e.message for e in result.errors] == ["line 2: column 'question': Input should be a valid string."]


def test_streams_a_batch_at_a_time(tmp_path):
    """The scan holds a batch of rows, not the file: its items come out before the file is read to its end."""
    path = parquet(tmp_path, {"prompt": [f"p{i}" for i in range(20_000)]}, row_group_size=5_000)
    scan = DatasetScan()
    items = scan_dataset(path, scan=scan)
    first = next(items)
    assert first.custom_id == "line-1" and scan.lines < 10_000
    rest = list(items)
    assert len(rest) == 19_999 and not any(isinstance(i, LineError) for i in rest)


def test_submit_dry_run_reads_a_table(tmp_path):
    path = parquet(tmp_path, ROWS)
    result = CliRunner().invoke(cli, ["submit", str(path), "--dry-run", "--template", "Q: {text}", "--chat"])
    assert result.exit_code == 0, result.output
    assert "Dry run: 3 valid lines, 0 invalid" in result.output
    result = CliRunner().invoke(cli, ["submit", str(path), "--dry-run", "--template", "Q: {txt}"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (
        "Error: The template names the column 'txt', which the dataset does not have (did you mean 'text'?)."
    )
