"""Report section for training sweeps: loss and accuracy curves per configuration, and an accuracy table."""

from __future__ import annotations

from matplotlib.ticker import MaxNLocator

from upwell.results.figures import Fetch, Section, Table
from upwell.results.figures._common import (
    fmt,
    label,
    metrics_of,
    missing_note,
    new_figure,
    number,
    succeeded,
    to_png,
    varying,
)


def _curve(m: dict, key: str) -> list[float]:
    values = m.get(key)
    return [v for v in map(number, values) if v is not None] if isinstance(values, list) else []


def sections(results: list[dict], fetch: Fetch) -> list[Section]:
    ok = succeeded(results)
    ok.sort(key=lambda d: -(number(metrics_of(d).get("test_accuracy")) or 0.0))
    note = missing_note(results, ok)
    if not ok:
        return [Section("Training", text=note or "No shard produced metrics.")]
    keys = varying(ok)
    fig, (left, right) = new_figure(11, 4, ncols=2)
    for doc in ok:
        m = metrics_of(doc)
        loss, acc = _curve(m, "loss"), _curve(m, "test_accuracy_history")
        line = left.plot(range(1, len(loss) + 1), loss, ".-", label=label(doc, keys))[0]
        at = m.get("test_epochs") or range(1, len(acc) + 1)  # evaluated epochs (eval_every)
        right.plot(list(at)[:len(acc)], acc, ".-", color=line.get_color())
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set(xlabel="epoch", ylabel="training loss", yscale="log", title="Loss per configuration")
    left.legend(fontsize="small")
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set(xlabel="epoch", ylabel="test accuracy", title="Test accuracy per configuration")
    table = Table(caption="Configurations by final test accuracy",
                  columns=["configuration", "test accuracy", "epochs", "samples/s", "device", "ranks", "resumed from"],
                  rows=[[label(d, keys), fmt(metrics_of(d).get("test_accuracy")), fmt(metrics_of(d).get("epoch")),
                         fmt(metrics_of(d).get("samples_per_second"), 3), str(metrics_of(d).get("device", "—")),
                         fmt(metrics_of(d).get("world_size")), fmt(metrics_of(d).get("resumed_from_epoch"))]
                        for d in ok])
    best = ok[0]
    text = (f"{len(ok)} configurations; best test accuracy {fmt(metrics_of(best).get('test_accuracy'))} "
            f"({label(best, keys)}). {note}").strip()
    return [Section("Training", text=text, tables=[table],
                    figures=[to_png(fig, "Training loss and test accuracy per epoch")])]
