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


def _rate(value) -> str:
    """Samples a second as people count them: 3,410 rather than 3.41e+03."""
    x = number(value)
    return f"{x:,.0f}" if x is not None and x >= 100 else fmt(value, 3)


def sections(results: list[dict], fetch: Fetch) -> list[Section]:
    ok = succeeded(results)
    ok.sort(key=lambda d: -(number(metrics_of(d).get("test_accuracy")) or 0.0))
    note = missing_note(results, ok)
    if not ok:
        return [Section("Training", text=note or "No shard produced metrics.")]
    keys = varying(ok)
    fig, (left, right) = new_figure(11, 4, ncols=2)
    colors = []
    for doc in ok:
        loss = _curve(metrics_of(doc), "loss")
        colors.append(left.plot(range(1, len(loss) + 1), loss, ".-", label=label(doc, keys))[0].get_color())
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set(xlabel="epoch", ylabel="training loss", yscale="log", title="Loss per configuration")
    left.legend(fontsize="small")
    curves = accuracy_panel(right, ok, colors, keys)
    table = Table(caption="Configurations by final test accuracy",
                  columns=["configuration", "test accuracy", "epochs", "samples/s", "device", "ranks", "resumed from"],
                  rows=[[label(d, keys), fmt(metrics_of(d).get("test_accuracy")), fmt(metrics_of(d).get("epoch")),
                         _rate(metrics_of(d).get("samples_per_second")), str(metrics_of(d).get("device", "—")),
                         fmt(metrics_of(d).get("world_size")), fmt(metrics_of(d).get("resumed_from_epoch"))]
                        for d in ok])
    best = ok[0]
    text = (f"{len(ok)} configurations; best test accuracy {fmt(metrics_of(best).get('test_accuracy'))} "
            f"({label(best, keys)}). {note}").strip()
    return [Section("Training", text=text, tables=[table],
                    figures=[to_png(fig, "Training loss per epoch, and test accuracy " +
                                    ("per evaluated epoch" if curves else "per configuration at its last epoch"))])]


def accuracy_panel(ax, ok: list[dict], colors: list[str], keys: list[str]) -> bool:
    """Test accuracy per configuration on ``ax``, in each configuration's colour (``ok`` best first); True
    where it drew curves. A curve needs at least two evaluated epochs: with one (``eval_every`` 0, the default,
    evaluates after the last epoch only) every configuration would be a lone dot at the same epoch, so the
    panel is a dot plot instead, one row a configuration, the best on top, each value written beside its dot."""
    histories = [_curve(metrics_of(d), "test_accuracy_history") for d in ok]
    if any(len(h) > 1 for h in histories):
        for doc, acc, color in zip(ok, histories, colors, strict=True):
            at = metrics_of(doc).get("test_epochs") or range(1, len(acc) + 1)  # evaluated epochs (eval_every)
            ax.plot(list(at)[:len(acc)], acc, ".-", color=color)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(xlabel="epoch", ylabel="test accuracy", title="Test accuracy per configuration")
        return True
    final = [number(metrics_of(d).get("test_accuracy")) for d in ok]
    rows = [(label(d, keys), v, c) for d, v, c in zip(ok, final, colors, strict=True) if v is not None]
    for y, (_, v, c) in enumerate(reversed(rows)):
        ax.plot([v], [y], "o", color=c, markersize=8)
        ax.annotate(f"{v:.4g}", (v, y), xytext=(7, 0), textcoords="offset points", va="center", fontsize="small")
    ax.set_yticks(range(len(rows)), [name for name, _, _ in reversed(rows)])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.margins(x=0.25)
    ax.grid(axis="y", visible=False)
    ax.set(xlabel="test accuracy", title="Final test accuracy per configuration")
    return False
