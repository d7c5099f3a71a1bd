"""The Infill docker: prompt, seed, steps, strength, LoRAs, reference images, live mode, engine and token;
progress, previews and cancel while the engine denoises; results as new layers above the active
one.

Threading: the docker lives on Krita's GUI thread, where every document call is made. The
SDK's callbacks arrive on its own thread and only emit the Bridge's signals, which Qt queues
to the GUI thread.
"""
import os

from PyQt5.QtCore import QObject, QTimer, pyqtSignal
from PyQt5.QtGui import QPixmap
from PyQt5.QtWidgets import (QAbstractItemView, QCheckBox, QDoubleSpinBox, QFileDialog, QFormLayout, QHBoxLayout,
                             QHeaderView, QLabel, QLineEdit, QListWidget, QProgressBar, QPushButton, QSpinBox,
                             QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)
from krita import DockWidget, Krita

from . import layer_io
from .repaint import Repaint, Settings, infill_client

LIVE_LAYER = "Infill (live)"
SETTINGS_GROUP = "infill"
# A LoRA's strength: the range of the "adapters" row of the parameter table
# (protocol/infill_protocol/edit_parameters.h); the Krita test checks that they agree.
LORA_STRENGTH_RANGE = (-10.0, 10.0)
# The most reference images an edit takes: max_length of the table's "references" row (the
# Krita test checks that too).
REFERENCE_LIMIT = 4


class Bridge(QObject):
    """The SDK's callbacks, carried to the GUI thread. The first argument is the edit's serial."""
    progress = pyqtSignal(int, int, int)
    preview = pyqtSignal(int, bytes, int)
    done = pyqtSignal(int, str, str, bytes, str)


class InfillDocker(DockWidget):
    def __init__(self):
        super().__init__()
        self.setWindowTitle("Infill")
        self.bridge = Bridge()
        self.bridge.progress.connect(self._on_progress)
        self.bridge.preview.connect(self._on_preview)
        self.bridge.done.connect(self._on_done)
        self._client = None
        self._client_key = None
        self._serial = 0
        self._edits = {}  # serial -> Repaint, until its result is in
        self._live_job_id = 0
        self._live_signature = None
        self._loras = []  # one dict per row of the LoRA table: path, name, id, uploaded_to (client key)
        self._references = []  # one dict per row of the reference list: path, name, id, uploaded_to
        self.results = []  # layers added, for the status line and tests

        root = QWidget(self)
        form = QFormLayout()
        k = Krita.instance()
        self.endpoint = QLineEdit(k.readSetting(SETTINGS_GROUP, "endpoint", ""))
        self.endpoint.setPlaceholderText("the local engine")
        self.endpoint.setToolTip("unix:/path/engine.sock or http://host:port; empty: the local engine")
        self.token = QLineEdit(k.readSetting(SETTINGS_GROUP, "token", ""))
        self.token.setEchoMode(QLineEdit.Password)
        self.token.setToolTip("The engine's bearer token (remote engines over TCP)")
        self.prompt = QLineEdit()
        self.prompt.setPlaceholderText("what to paint into the selection")
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.steps = QSpinBox()
        self.steps.setRange(0, 1000)
        self.steps.setSpecialValueText("model default")
        self.strength = QDoubleSpinBox()
        self.strength.setRange(0.05, 1.0)
        self.strength.setSingleStep(0.05)
        self.strength.setValue(1.0)
        self.live = QCheckBox("Live: repaint as the selection changes")
        self.loras = QTableWidget(0, 2)
        self.loras.setHorizontalHeaderLabels(["LoRA", "Strength"])
        self.loras.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self.loras.verticalHeader().setVisible(False)
        self.loras.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.loras.setSelectionMode(QAbstractItemView.SingleSelection)
        self.loras.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.loras.setMaximumHeight(110)
        self.loras.setToolTip("LoRAs applied to every edit, in this order (FLUX.2 models)")
        self.add_lora_button = QPushButton("Add LoRA...")
        self.add_lora_button.setToolTip("Upload a LoRA (.safetensors) to the engine and add it to the list")
        self.remove_lora_button = QPushButton("Remove")
        self.remove_lora_button.setToolTip("Take the selected LoRA off the list")
        lora_buttons = QHBoxLayout()
        lora_buttons.addWidget(self.add_lora_button)
        lora_buttons.addWidget(self.remove_lora_button)
        lora_box = QVBoxLayout()
        lora_box.addWidget(self.loras)
        lora_box.addLayout(lora_buttons)
        self.references_list = QListWidget()
        self.references_list.setMaximumHeight(80)
        self.references_list.setToolTip(f"Reference images sent with every edit, at most {REFERENCE_LIMIT} "
                                         "(FLUX.2 models)")
        self.add_reference_button = QPushButton("Add image...")
        self.add_reference_button.setToolTip("Upload an image file to the engine as a reference for the edits")
        self.remove_reference_button = QPushButton("Remove")
        self.remove_reference_button.setToolTip("Take the selected reference image off the list")
        reference_buttons = QHBoxLayout()
        reference_buttons.addWidget(self.add_reference_button)
        reference_buttons.addWidget(self.remove_reference_button)
        reference_box = QVBoxLayout()
        reference_box.addWidget(self.references_list)
        reference_box.addLayout(reference_buttons)
        form.addRow("Engine", self.endpoint)
        form.addRow("Token", self.token)
        form.addRow("Prompt", self.prompt)
        form.addRow("Seed", self.seed)
        form.addRow("Steps", self.steps)
        form.addRow("Strength", self.strength)
        form.addRow("LoRAs", lora_box)
        form.addRow("References", reference_box)
        self.generate_button = QPushButton("Repaint selection")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        buttons = QHBoxLayout()
        buttons.addWidget(self.generate_button)
        buttons.addWidget(self.cancel_button)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.preview = QLabel()
        self.preview.setMinimumHeight(96)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        layout = QVBoxLayout(root)
        layout.addLayout(form)
        layout.addWidget(self.live)
        layout.addLayout(buttons)
        layout.addWidget(self.progress)
        layout.addWidget(self.preview)
        layout.addWidget(self.status)
        layout.addStretch(1)
        self.setWidget(root)

        self.generate_button.clicked.connect(lambda: self.generate())
        self.cancel_button.clicked.connect(self.cancel)
        self.add_lora_button.clicked.connect(lambda: self.add_lora())
        self.remove_lora_button.clicked.connect(lambda: self.remove_lora())
        self.add_reference_button.clicked.connect(lambda: self.add_reference())
        self.remove_reference_button.clicked.connect(lambda: self.remove_reference())
        self.live.toggled.connect(self._live_toggled)
        self.live_timer = QTimer(self)
        self.live_timer.setInterval(300)
        self.live_timer.timeout.connect(lambda: self.live_tick())

    # Krita calls this when the active canvas changes; the docker reads the active document
    # when it acts, so there is nothing to follow.
    def canvasChanged(self, canvas):
        pass

    def client(self):
        """The engine connection for the current endpoint and token (one per docker)."""
        key = (self.endpoint.text().strip(), self.token.text().strip())
        if self._client is None or key != self._client_key:
            if self._client is not None:
                self._client.close()
            k = Krita.instance()
            k.writeSetting(SETTINGS_GROUP, "endpoint", key[0])
            k.writeSetting(SETTINGS_GROUP, "token", key[1])
            # One client name per Krita process: the engine supersedes and limits per client,
            # so two painters (or two Kritas) never cancel each other's edits.
            self._client = infill_client.Client(endpoint=key[0] or None, token=key[1] or None,
                                                client_name=f"krita-{os.getpid()}")
            self._client_key = key
        return self._client

    def settings(self, live=False):
        """The edit's settings from the widgets; uploads LoRAs and reference images the engine
        does not have yet."""
        return Settings(prompt=self.prompt.text().strip(), seed=self.seed.value(), steps=self.steps.value(),
                        strength=self.strength.value(), live=live, preview_every_steps=1, adapters=self.adapters(),
                        references=self.references())

    # ---- LoRAs ----

    def add_lora(self, path=None, strength=1.0):
        """Uploads a LoRA file to the engine through the binding and appends it to the list
        (`path` None: ask with a file dialog). Returns its row, or -1 with the reason in the
        status line (a file that cannot be read, or one the engine's model cannot use)."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Add a LoRA", "", "LoRA (*.safetensors);;All files (*)")
            if not path:
                return -1
        try:
            info = self.client().upload_adapter(path)
        except infill_client.InfillError as e:
            self.status.setText(f"LoRA {os.path.basename(path)} not added: {e.message}")
            return -1
        for row, entry in enumerate(self._loras):
            if entry["id"] == info["id"]:
                self.status.setText(f"LoRA \"{entry['name']}\" is in the list already")
                return row
        row = len(self._loras)
        self._loras.append({"path": path, "name": info["name"], "id": info["id"], "uploaded_to": self._client_key})
        self.loras.insertRow(row)
        item = QTableWidgetItem(info["name"])
        item.setToolTip(f"{path}\n{info['format']}, rank {info['max_rank']}, {info['layers']} layers\n{info['id']}")
        self.loras.setItem(row, 0, item)
        spin = QDoubleSpinBox()
        spin.setRange(*LORA_STRENGTH_RANGE)
        spin.setSingleStep(0.1)
        spin.setValue(strength)
        self.loras.setCellWidget(row, 1, spin)
        self.status.setText(f"Added LoRA \"{info['name']}\" ({info['format']}, rank {info['max_rank']})")
        return row

    def remove_lora(self, row=None):
        """Takes a LoRA off the list (`row` None: the selected one); the engine keeps the file."""
        if row is None:
            selected = self.loras.selectionModel().selectedRows()
            if not selected:
                return
            row = selected[0].row()
        if 0 <= row < len(self._loras):
            del self._loras[row]
            self.loras.removeRow(row)

    def set_lora_strength(self, row, strength):
        self.loras.cellWidget(row, 1).setValue(strength)

    def adapters(self):
        """The list as an edit's adapters, (id, strength) in order. A LoRA not uploaded to the
        current engine (the endpoint changed, or the engine lost it) is uploaded again from its
        file: raises InfillError naming the file when that fails."""
        client = self.client()
        out = []
        for row, entry in enumerate(self._loras):
            if entry["uploaded_to"] != self._client_key:
                entry["id"] = client.upload_adapter(entry["path"])["id"]
                entry["uploaded_to"] = self._client_key
            out.append((entry["id"], self.loras.cellWidget(row, 1).value()))
        return out

    # ---- reference images ----

    def _upload_reference(self, path):
        """The template id of the image file at `path`, uploaded through the binding."""
        with open(path, "rb") as f:
            data = f.read()
        return self.client().upload(data, os.path.basename(path))["id"]

    def add_reference(self, path=None):
        """Uploads an image file to the engine as a template and appends it to the reference
        list (`path` None: ask with a file dialog). Returns its row, or -1 with the reason in the
        status line (the list is full, the file cannot be read, the engine refuses it)."""
        if len(self._references) >= REFERENCE_LIMIT:
            self.status.setText(f"At most {REFERENCE_LIMIT} reference images: remove one first")
            return -1
        if path is None:
            path, _ = QFileDialog.getOpenFileName(
                self, "Add a reference image", "",
                "Images (*.png *.jpg *.jpeg *.tif *.tiff *.exr *.webp *.psd);;All files (*)")
            if not path:
                return -1
        name = os.path.basename(path)
        try:
            image_id = self._upload_reference(path)
        except OSError as e:
            self.status.setText(f"Reference {name} not added: cannot read {path}: {e.strerror or e}")
            return -1
        except infill_client.InfillError as e:
            self.status.setText(f"Reference {name} not added: {e.message}")
            return -1
        for row, entry in enumerate(self._references):
            if entry["id"] == image_id:
                self.status.setText(f"Reference \"{entry['name']}\" is in the list already")
                return row
        self._references.append({"path": path, "name": name, "id": image_id, "uploaded_to": self._client_key})
        self.references_list.addItem(name)
        self.references_list.item(len(self._references) - 1).setToolTip(f"{path}\n{image_id}")
        self.status.setText(f"Added reference image \"{name}\"")
        return len(self._references) - 1

    def remove_reference(self, row=None):
        """Takes an image off the reference list (`row` None: the selected one)."""
        if row is None:
            row = self.references_list.currentRow()
        if 0 <= row < len(self._references):
            del self._references[row]
            self.references_list.takeItem(row)

    def references(self):
        """The list as an edit's references (template ids, in order). An image not uploaded to
        the current engine (the endpoint changed, or the engine dropped the template) is uploaded
        again from its file: raises InfillError, or OSError naming the file, when that fails."""
        for entry in self._references:
            if entry["uploaded_to"] != self._client_key:
                entry["id"] = self._upload_reference(entry["path"])
                entry["uploaded_to"] = self._client_key
        return [entry["id"] for entry in self._references]

    def generate(self, document=None, node=None, live=False):
        """Repaints the selection of `node` (default: the active layer of the active document).
        Returns the edit's serial, or 0 with the reason in the status line."""
        document = document or Krita.instance().activeDocument()
        node = node or (document.activeNode() if document else None)
        for attempt in (1, 2):
            try:
                repaint = Repaint(Krita.instance(), self.client(), document, node, self.settings(live))
                self._serial += 1
                serial = self._serial
                b = self.bridge
                job = repaint.start(
                    supersedes=self._live_job_id if live else 0,
                    on_progress=lambda done, total: b.progress.emit(serial, done, total),
                    on_preview=lambda png, steps: b.preview.emit(serial, png, steps),
                    on_done=lambda state, error, data, media: b.done.emit(serial, state, str(error or ""), data, media))
                break
            except infill_client.InfillError as e:
                if attempt == 1 and e.engine_code == "unknown_adapter" and self._loras:
                    # The engine no longer holds a LoRA of the list (deleted from its store, or
                    # its cache folder cleared): upload the files again and retry once.
                    for entry in self._loras:
                        entry["uploaded_to"] = None
                    continue
                if attempt == 1 and e.engine_code == "template_not_found" and self._references:
                    # The engine dropped a reference image (its template store is a cache):
                    # upload the files again and retry once.
                    for entry in self._references:
                        entry["uploaded_to"] = None
                    continue
                self.status.setText(str(e))
                return 0
            except OSError as e:
                self.status.setText(f"Cannot read {e.filename}: {e.strerror or e}")
                return 0
            except layer_io.LayerError as e:
                self.status.setText(str(e))
                return 0
        self._edits[serial] = repaint
        if live:
            self._live_job_id = job.id
        self.cancel_button.setEnabled(True)
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.status.setText(f"Edit {job.id} queued on {self._client.endpoint}")
        return serial

    def cancel(self):
        for repaint in list(self._edits.values()):
            if repaint.job is not None:
                try:
                    repaint.job.cancel()
                except infill_client.InfillError as e:
                    self.status.setText(str(e))

    def busy(self):
        return bool(self._edits)

    def _live_toggled(self, on):
        self._live_signature = None
        if on:
            self.live_timer.start()
        else:
            self.live_timer.stop()

    def live_tick(self, document=None, node=None):
        """Live mode: a new edit, superseding the last, when the selection changed since."""
        document = document or Krita.instance().activeDocument()
        if document is None or document.selection() is None:
            return 0
        s = document.selection()
        signature = (s.x(), s.y(), s.width(), s.height(), hash(bytes(s.pixelData(s.x(), s.y(), s.width(), s.height()))))
        if signature == self._live_signature:
            return 0
        self._live_signature = signature
        return self.generate(document, node, live=True)

    def _on_progress(self, serial, done, total):
        if serial != self._serial:
            return  # an older edit of this docker, superseded or cancelled
        self.progress.setRange(0, max(1, total))
        self.progress.setValue(done)

    def _on_preview(self, serial, png, steps_done):
        if serial != self._serial:
            return
        pixmap = QPixmap()
        if pixmap.loadFromData(png, "PNG"):
            self.preview.setPixmap(pixmap.scaledToHeight(96))

    def _on_done(self, serial, state, error, data, media_type):
        repaint = self._edits.pop(serial, None)
        self.cancel_button.setEnabled(bool(self._edits))
        if repaint is None:
            return
        if state != "done":
            if serial == self._serial:
                self.status.setText(f"Edit {state}: {error}" if error else f"Edit {state}")
            return
        try:
            if repaint.settings.live:
                # Live mode keeps one result layer, replaced by each newer stroke's.
                for n in repaint.node.parentNode().childNodes():
                    if n.name() == LIVE_LAYER:
                        n.remove()
            layer = repaint.finish(data, media_type)
            if repaint.settings.live:
                layer.setName(LIVE_LAYER)
        except layer_io.LayerError as e:
            self.status.setText(str(e))
            return
        self.results.append(layer)
        if serial == self._serial:
            self.progress.setValue(self.progress.maximum())
            self.status.setText(f"Added layer \"{layer.name()}\"")
