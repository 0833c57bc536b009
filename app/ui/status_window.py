"""What this PC does for the swarm: stage and layers, what runs them (backend, device
memory, layers on the GPU), sessions, timings, the path to the next hop, the local
OpenAI API and a small live throughput plot."""

from __future__ import annotations

from collections import deque

from PySide6.QtCore import QPointF, QRectF, Qt, Slot
from PySide6.QtGui import QCloseEvent, QColor, QPainter, QPaintEvent, QPen, QPolygonF
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from app.node_status import NodeStatus, ServeState
from app.ui.controllers import ApiController, NodeController
from app.ui.icons import state_pixmap
from core.types import format_layers
from net.wire.versions import this_release


class ThroughputPlot(QWidget):
    """The last few minutes of tokens/s through this stage, drawn as a line."""

    def __init__(self, points: int = 90, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.samples: deque[float] = deque(maxlen=points)
        self.setMinimumSize(320, 110)

    def add(self, value: float) -> None:
        self.samples.append(max(0.0, value))
        self.update()

    def paintEvent(self, _event: QPaintEvent) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(self.rect()).adjusted(40, 8, -8, -18)
        p.fillRect(self.rect(), QColor("#fbfbfd"))
        p.setPen(QPen(QColor("#d0d4dc"), 1))
        p.drawRect(r)
        top = max([1.0, *self.samples]) * 1.15
        p.setPen(QColor("#6b7280"))
        p.drawText(QRectF(0, r.top() - 6, 36, 14), Qt.AlignmentFlag.AlignRight, f"{top:.0f}")
        p.drawText(QRectF(0, r.bottom() - 8, 36, 14), Qt.AlignmentFlag.AlignRight, "0")
        p.drawText(
            QRectF(r.left(), r.bottom() + 2, r.width(), 14),
            Qt.AlignmentFlag.AlignCenter,
            "tokens/s through this stage",
        )
        n = self.samples.maxlen or 1
        if len(self.samples) >= 2:
            step = r.width() / (n - 1)
            x0 = r.right() - step * (len(self.samples) - 1)
            poly = QPolygonF(
                [
                    QPointF(x0 + i * step, r.bottom() - r.height() * v / top)
                    for i, v in enumerate(self.samples)
                ]
            )
            p.setPen(QPen(QColor("#2e9e5b"), 2))
            p.drawPolyline(poly)
        p.end()


class StatusWindow(QWidget):
    def __init__(
        self, node: NodeController, api: ApiController | None = None, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.node = node
        self.api = api
        self.setWindowTitle("Sangama status")
        self.resize(520, 540)  # room for the plot below the compute rows
        self.icon = QLabel()
        self.headline = QLabel()
        font = self.headline.font()
        font.setPointSizeF(font.pointSizeF() * 1.3)
        font.setBold(True)
        self.headline.setFont(font)
        self.reason = QLabel()
        self.reason.setWordWrap(True)
        self.reason.setStyleSheet("color: #c62828;")
        self.reason.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.fields: dict[str, QLabel] = {}
        box = QGroupBox("This PC in the swarm")
        form = QFormLayout(box)
        for key, label in (
            ("node", "Node"),
            ("coordinator", "Coordinator"),
            ("swarm", "The swarm"),
            ("release", "Release"),
            ("stage", "Stage"),
            ("address", "Listening on"),
            ("next", "Next hop"),
            ("sessions", "Sessions"),
            ("memory", "Memory"),
            ("backend", "Runs on"),
            ("device_memory", "Device memory"),
            ("gpu_layers", "GPU layers"),
            ("timings", "Timings"),
            ("api", "OpenAI API"),
        ):
            value = QLabel("—")
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            value.setWordWrap(True)
            self.fields[key] = value
            form.addRow(f"{label}:", value)
        self.plot = ThroughputPlot()

        head = QVBoxLayout()
        head.addWidget(self.headline)
        head.addWidget(self.reason)
        top = QWidget()
        from PySide6.QtWidgets import QHBoxLayout

        hl = QHBoxLayout(top)
        hl.setContentsMargins(0, 0, 0, 0)
        hl.addWidget(self.icon)
        hl.addLayout(head, 1)
        layout = QVBoxLayout(self)
        layout.addWidget(top)
        layout.addWidget(box)
        layout.addWidget(self.plot, 1)
        node.status_changed.connect(self.show_status)
        self.show_status(node.status)
        if api is not None:
            api.changed.connect(self._show_api)
        self._show_api()

    @Slot(object)
    def show_status(self, s: NodeStatus) -> None:
        self.icon.setPixmap(state_pixmap(s, 40))
        head = s.summary.removeprefix("Sangama: ")
        self.headline.setText(head[0].upper() + head[1:])
        self.reason.setText(s.error)
        self.reason.setVisible(bool(s.error))
        f = self.fields
        f["node"].setText(s.node_id or "not joined")
        f["coordinator"].setText(s.coordinator or "—")
        f["swarm"].setText(s.swarm or "—")
        f["release"].setText(s.update or f"{this_release()}, current")
        if s.layers is not None:
            a, b = s.layers
            n = f"{b - a} layer{'s' * (b - a != 1)}"
            f["stage"].setText(f"{format_layers(a, b)} ({n}) of {s.model or 'the model'}")
        elif s.standby is not None:
            standing_by = format_layers(*s.standby)
            f["stage"].setText(f"none assigned yet; a spare for {standing_by} (pieces ready)")
        else:
            f["stage"].setText("none assigned yet")
        f["address"].setText(s.address or "—")
        if s.state is ServeState.SERVING:
            f["next"].setText(s.next_hop or "last stage: tokens go straight back to the client")
        else:
            f["next"].setText("—")
        finishing = (
            f"; finishing {s.finishing} before the stage is freed"
            if s.state in (ServeState.PAUSING, ServeState.MOVING)
            else ""
        )
        f["sessions"].setText(
            f"{s.running} running now, {s.sessions} since start, {s.steps} steps, "
            f"{s.errors} errors{finishing}"
        )
        rtt = f", {s.rtt_ms:.1f} ms round trip to the next hop" if s.rtt_ms is not None else ""
        f["timings"].setText(
            f"{s.compute_ms:.1f} ms compute and {s.queue_ms:.1f} ms waiting in the last step{rtt}"
        )
        f["memory"].setText(f"{s.memory} in use by Sangama" if s.memory else "—")
        c = s.compute  # only while a stage is loaded; gone when it is freed
        f["backend"].setText(c.backend if c is not None else "—")
        f["device_memory"].setText(c.memory_text if c is not None else "—")
        f["gpu_layers"].setText(c.layers_text if c is not None else "—")
        if s.state is ServeState.SERVING:
            self.plot.add(s.throughput)

    @Slot()
    def _show_api(self) -> None:
        self.fields["api"].setText(self.api.text if self.api is not None else "off")

    def closeEvent(self, event: QCloseEvent) -> None:
        event.ignore()
        self.hide()
