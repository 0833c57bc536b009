"""State icons drawn with QPainter: no image files to ship."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QIcon, QPainter, QPen, QPixmap

from app.node_status import NodeStatus, ServeState

COLORS = {
    ServeState.NOT_JOINED: "#8a8f98",
    ServeState.JOINING: "#3d7bd9",
    ServeState.WAITING: "#3d7bd9",
    ServeState.DOWNLOADING: "#3d7bd9",
    ServeState.LOADING: "#d9a23d",
    ServeState.SERVING: "#2e9e5b",
    ServeState.PAUSING: "#d9a23d",
    ServeState.MOVING: "#d9a23d",
    ServeState.PAUSED: "#8a8f98",
    ServeState.ERROR: "#d23c3c",
}


def state_pixmap(status: NodeStatus, size: int = 64) -> QPixmap:
    pm = QPixmap(size, size)
    pm.fill(Qt.GlobalColor.transparent)
    p = QPainter(pm)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    color = QColor(COLORS[status.state])
    m = size * 0.06
    rect = QRectF(m, m, size - 2 * m, size - 2 * m)
    state = status.state
    if state is ServeState.DOWNLOADING:
        p.setPen(QPen(QColor("#c9d3e3"), size * 0.12))
        p.drawEllipse(rect.adjusted(size * 0.06, size * 0.06, -size * 0.06, -size * 0.06))
        pen = QPen(color, size * 0.12)
        pen.setCapStyle(Qt.PenCapStyle.FlatCap)
        p.setPen(pen)
        span = int(-360 * 16 * max(0.02, min(1.0, status.progress)))
        p.drawArc(
            rect.adjusted(size * 0.06, size * 0.06, -size * 0.06, -size * 0.06), 90 * 16, span
        )
    else:
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(QBrush(color))
        p.drawEllipse(rect)
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(QBrush(QColor("white")))
    c = size / 2
    if state in (ServeState.PAUSED, ServeState.PAUSING):
        w, h = size * 0.11, size * 0.38
        p.drawRect(QRectF(c - w * 1.6, c - h / 2, w, h))
        p.drawRect(QRectF(c + w * 0.6, c - h / 2, w, h))
    elif state is ServeState.SERVING:
        # three stages joined in a chain
        r = size * 0.08
        pts = [QPointF(c - size * 0.22, c), QPointF(c, c), QPointF(c + size * 0.22, c)]
        p.setPen(QPen(QColor("white"), size * 0.05))
        p.drawLine(pts[0], pts[2])
        p.setPen(Qt.PenStyle.NoPen)
        for pt in pts:
            p.drawEllipse(pt, r, r)
    elif state in (ServeState.ERROR, ServeState.NOT_JOINED, ServeState.LOADING):
        text = {"error": "!", "not joined": "+", "loading": "…"}[state.value]
        font = QFont()
        font.setBold(True)
        font.setPixelSize(int(size * 0.6))
        p.setFont(font)
        p.setPen(QColor("white"))
        p.drawText(QRectF(0, 0, size, size), Qt.AlignmentFlag.AlignCenter, text)
    elif state in (ServeState.JOINING, ServeState.WAITING, ServeState.MOVING):
        for i in range(3):
            p.drawEllipse(QPointF(c + (i - 1) * size * 0.2, c), size * 0.06, size * 0.06)
    p.end()
    return pm


def state_icon(status: NodeStatus) -> QIcon:
    icon = QIcon()
    for size in (16, 22, 24, 32, 48, 64):
        icon.addPixmap(state_pixmap(status, size))
    return icon
