"""The dashboard's charts, built with plotly's Python API from the JSON of :mod:`dp_operators.dashboard.queries`.

Each function returns a figure as ``fig.to_plotly_json()`` gives it (``{"data": [...], "layout": {...}}``, plain
JSON types) without a template: ``static/dashboard.js`` sets the look (the parts of plotly's ``plotly_white``
template these charts use) once for every chart, rather than each figure carrying the whole template (7 KB). A page
embeds a figure in a ``<script type="application/json">`` element (Jinja's ``tojson``, which escapes ``<``, ``>``,
``&`` and ``'`` as ``\\u003c`` etc.) and ``static/dashboard.js`` draws it with ``Plotly.newPlot`` and the plotly.js
that ships inside the plotly package (served by the app, no CDN).

Names from the ledger (accounts, group-by values) are shown through plotly's text renderer, which reads a few
HTML-like tags (``<b>``, ``<br>``, ``<a href>``) and entities in labels; :func:`_label` escapes them so a name is
shown as it is written.
"""

from __future__ import annotations

import datetime as dt
import html
import sys
from typing import Any

import plotly.graph_objects as go

from dp_operators.ledger.bounded import read_number

_FONT = {"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", "size": 13}
_SPENT, _RESERVED, _CAP, _FORECAST = "#3b6ea8", "#e0a030", "#b03a2e", "#6c757d"


def _layout(**layout: Any) -> dict[str, Any]:
    return {
        "template": "none",  # plotly's empty template; dashboard.js sets the look
        "font": _FONT,
        "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
        "legend": {"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom", "traceorder": "normal"},
        **layout,
    }


def _plain(figure: go.Figure) -> dict[str, Any]:
    """The figure's JSON without its (empty) template: dashboard.js gives every chart the same one."""
    plain = figure.to_plotly_json()
    plain["layout"].pop("template", None)
    return plain


def _label(text: Any) -> str:
    """``text`` as plotly shows it literally: its tag and entity syntax (``<``, ``>``, ``&``) escaped."""
    return html.escape(str(text), quote=False)


def overview_figure(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A horizontal stacked bar per account: settled spend and reserved spend as fractions of the cap.

    Args:
        rows: :func:`~dp_operators.dashboard.queries.accounts_overview` rows (``name``, ``cap``, ``spent``,
            ``reserved`` as exact fraction strings; ``spent`` includes ``reserved``).

    Returns:
        the figure: x is the fraction of the cap (1 = the cap, drawn as a line), computed exactly from the
        strings and rounded to floats once; an account with a zero cap gets empty bars; an unreadable account
        (``unreadable`` in its row) gets no bar.
    """
    names, settled, reserved = [], [], []
    for row in rows:
        if row.get("unreadable"):
            continue  # its numbers are None; the table names what is wrong
        cap, spent, held = read_number(row["cap"]), read_number(row["spent"]), read_number(row["reserved"])
        names.append(_label(row["name"]))
        settled.append(float((spent - held) / cap) if cap else 0.0)
        reserved.append(float(held / cap) if cap else 0.0)
    hover = "%{y}: %{x:.2%} of the cap<extra>%{fullData.name}</extra>"
    fig = go.Figure(
        [
            go.Bar(y=names, x=settled, orientation="h", name="spent (settled)", marker_color=_SPENT,
                   hovertemplate=hover),
            go.Bar(y=names, x=reserved, orientation="h", name="reserved (in flight)", marker_color=_RESERVED,
                   hovertemplate=hover),
        ],
        layout=_layout(
            barmode="stack",
            height=120 + 32 * len(rows),
            xaxis={"title": {"text": "fraction of the cap"}, "tickformat": ".0%",
                   "range": [0, max([1.05] + [s + r for s, r in zip(settled, reserved)])]},
            yaxis={"type": "category", "autorange": "reversed", "automargin": True},
        ),
    )
    fig.add_vline(x=1, line_color=_CAP, line_dash="dot")
    return _plain(fig)


def burn_down_figure(detail: dict[str, Any]) -> dict[str, Any]:
    """Cumulative settled spend against time, the cap as a horizontal line, and the forecast as a dashed line.

    Args:
        detail: :func:`~dp_operators.dashboard.queries.account_detail`'s dict: ``burn_down`` (``unit``,
            ``cap_float``, ``points`` of ``time``/``cumulative``/``charges``) and ``forecast`` (``window_end`` is
            "now"; ``remaining``, ``rate_per_day``, ``days_left``, ``exhausts_at``).

    Returns:
        the figure: traces ``settled spend`` (a step line held from the last settled charge to now; absent
        without settled charges, and the chart says so), the forecast (from (now, cap - remaining), where the
        spend includes reserved charges, to (exhaustion date, cap); only when that date is still to come) and
        the cap (last; from the first settled charge, or the forecast window's start, to the end of the chart).
    """
    burn, forecast = detail["burn_down"], detail["forecast"]
    unit, cap, points = burn["unit"], burn["cap_float"], burn["points"]
    now = forecast["window_end"]
    fig = go.Figure(layout=_layout(height=340, yaxis={"title": {"text": f"settled spend ({unit})"},
                                                      "rangemode": "tozero"}))
    if points:
        fig.add_trace(
            go.Scatter(
                x=[p["time"] for p in points] + [now],
                y=[p["cumulative"] for p in points] + [points[-1]["cumulative"]],
                customdata=[p["charges"] for p in points] + [points[-1]["charges"]],
                mode="lines",
                line={"shape": "hv", "color": _SPENT, "width": 2},
                name="settled spend",
                hovertemplate=f"%{{x}}<br>%{{y:.6g}} {unit} in %{{customdata}} charges<extra></extra>",
            )
        )
    else:
        fig.add_annotation(text="no settled charges yet", showarrow=False, xref="paper", yref="paper",
                           x=0.5, y=0.5)
    end = now
    if forecast["exhausts_at"] is not None and forecast["days_left"]:
        end = forecast["exhausts_at"]
        fig.add_trace(
            go.Scatter(
                x=[now, end],
                y=[cap - forecast["remaining"], cap],
                mode="lines",
                line={"dash": "dash", "color": _FORECAST},
                name=f"forecast at {forecast['rate_per_day']:.6g} {unit}/day",
                hovertemplate=f"%{{x}}<br>%{{y:.6g}} {unit}<extra>forecast</extra>",
            )
        )
    # a trace rather than a layout shape: in the legend, and in the chart's data for whoever reads it
    start = points[0]["time"] if points else (
        dt.datetime.fromisoformat(now) - dt.timedelta(days=forecast["window_days"])).isoformat()
    fig.add_trace(
        go.Scatter(x=[start, end], y=[cap, cap], mode="lines", line={"dash": "dot", "color": _CAP},
                   name=f"cap {cap:.6g} {unit}", hoverinfo="name")
    )
    return _plain(fig)


#: A release chart with more values than this is drawn horizontally: one row per value, labels read level.
MAX_COLUMNS = 12
#: Pixels per value of a horizontal release chart.
ROW_HEIGHT = 20
# the height of a horizontal release chart's value axis, its title and the margins
_FRAME_HEIGHT = 90
#: Markers of a value whose interval is open on a side, pointing to that side; as (lower open, upper open).
_OPEN_MARKERS = {
    "vertical": {(False, False): "circle", (False, True): "triangle-up", (True, False): "triangle-down"},
    "horizontal": {(False, False): "circle", (False, True): "triangle-right", (True, False): "triangle-left"},
}


def _bound(value: float | None, open_side: str) -> str:
    return open_side if value is None else f"{value:.6g}"


#: The largest magnitude plotly.js plots: it takes larger numbers for missing ones (``FP_SAFE``, a ten-thousandth
#: of the largest double, in plotly.js's ``constants/numerical.js``).
PLOTTABLE = sys.float_info.max * 1e-4


def _double(value: Any) -> float | None:
    """``value`` as a double plotly.js can plot, or ``None`` (not a number, or beyond :data:`PLOTTABLE`)."""
    if type(value) not in (int, float):  # bool is an int subclass, not a published number
        return None
    try:
        value = float(value)
    except OverflowError:  # an int beyond the doubles
        return None
    return value if abs(value) <= PLOTTABLE else None


def _drawable(row: dict[str, Any]) -> tuple[float, float | None, float | None] | None:
    """A published value as the chart draws it: ``(value, bar below, bar above)``, a bar ``None`` on an open side;
    ``None`` when the value or a closed bound cannot be plotted (:func:`_double`)."""
    value = _double(row["value"])
    if value is None:
        return None
    bars = []
    for bound, sign in ((row["lower"], 1.0), (row["upper"], -1.0)):
        if bound is None:
            bars.append(None)
            continue
        bound = _double(bound)
        if bound is None:
            return None
        bars.append(sign * (value - bound))  # finite: both within PLOTTABLE
    return value, bars[0], bars[1]


def release_figure(aggregate: dict[str, Any]) -> dict[str, Any]:
    """The published values of one aggregate as points with their confidence intervals as error bars.

    Args:
        aggregate: an entry of :func:`~dp_operators.dashboard.queries.release_detail`'s ``aggregates`` with
            ``name``, ``group_by`` (column names), ``confidence`` and ``values`` (``key``, ``value``, ``lower``,
            ``upper``; a ``None`` bound is an unbounded side), already cut to the values to show.

    Returns:
        the figure: one point per value with asymmetric error bars from ``lower`` to ``upper``; a point open on a
        side has no bar there and a triangle marker pointing to its open side (a diamond when both are open); a
        quantile with no value interval (the exponential mechanism's: ``rank_half_width`` only) is a plain point
        whose hover text gives its rank half-width.
        A value's category label is its group-by key's values joined with `` · `` (the aggregate's name without
        a group-by); the column names are the category axis's title. Up to :data:`MAX_COLUMNS` values the
        categories are on x (values on y, ``error_y``); with more, on y from the top down in the values' order
        (values on x, ``error_x``) and the chart is :data:`ROW_HEIGHT` pixels taller per value. A value that
        is no number or beyond :data:`PLOTTABLE`, or whose closed bound is, is left out (the page's table shows
        it as stored) and a note above the plot says how many were.
    """
    columns = aggregate.get("group_by") or []
    rows = [(row, drawn) for row in aggregate["values"] if (drawn := _drawable(row)) is not None]
    skipped = len(aggregate["values"]) - len(rows)
    horizontal = len(rows) > MAX_COLUMNS
    markers = _OPEN_MARKERS["horizontal" if horizontal else "vertical"]
    labels, values, above, below, symbols, hover = [], [], [], [], [], []
    for row, (value, bar_below, bar_above) in rows:
        key = row["key"]
        label = " · ".join(str(key[column]) for column in key) or aggregate["name"]
        lower, upper = row["lower"], row["upper"]
        labels.append(_label(label))
        values.append(value)
        above.append(bar_above)
        below.append(bar_below)
        ranks = row.get("rank_half_width")  # a quantile's, in records
        named = "<br>".join(f"{_label(column)} = {_label(key[column])}" for column in key) or _label(label)
        if ranks is not None and lower is None and upper is None:  # a quantile whose guarantee is in ranks only
            symbols.append(markers[(False, False)])
            hover.append(f"{named}<br>value {_bound(value, '')}<br>within {ranks:.4g} ranks of its target")
            continue
        symbols.append(markers.get((lower is None, upper is None), "diamond"))
        hover.append(f"{named}<br>value {_bound(value, '')}<br>"
                     f"interval [{_bound(_double(lower), '-∞')}, {_bound(_double(upper), '+∞')}]"
                     + (f"<br>within {ranks:.4g} ranks of its target" if ranks is not None else ""))
    confidence = aggregate.get("confidence")
    shown_confidence = f" ({confidence * 100:.6g}% interval)" if _double(confidence) else ""
    value_title = {"text": "published value" + shown_confidence}
    error = {"type": "data", "symmetric": False, "array": above, "arrayminus": below,
             "color": _SPENT, "thickness": 1.5, "width": 4}
    category_axis = {"type": "category", "automargin": True,
                     "title": {"text": " · ".join(_label(column) for column in columns)}}
    value_axis = {"title": value_title, "automargin": True}
    margin = {"l": 60, "r": 20, "t": 40 if skipped else 20, "b": 50}  # no legend above the plot
    point = {"mode": "markers", "marker": {"symbol": symbols, "size": 9, "color": _SPENT}, "hovertext": hover,
             "hoverinfo": "text", "name": _label(aggregate["name"])}
    if horizontal:
        trace = go.Scatter(y=labels, x=values, error_x=error, **point)
        layout = _layout(height=_FRAME_HEIGHT + ROW_HEIGHT * len(rows), showlegend=False, margin=margin,
                         yaxis={**category_axis, "autorange": "reversed"}, xaxis=value_axis)
    else:
        trace = go.Scatter(x=labels, y=values, error_y=error, **point)
        layout = _layout(height=340, showlegend=False, margin=margin, xaxis=category_axis, yaxis=value_axis)
    fig = go.Figure(trace, layout=layout)
    if skipped:
        fig.add_annotation(text=f"{skipped} of {len(aggregate['values'])} values not drawn: no number, or beyond "
                                f"±{PLOTTABLE:.2g}, which a chart cannot plot (the table shows them)",
                           showarrow=False, xref="paper", yref="paper", x=0, y=1, xanchor="left", yanchor="bottom")
    return _plain(fig)
