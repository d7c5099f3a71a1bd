"""Infill for Krita 5: repaint the selection of the active layer with the Infill engine.

A client of the engine through libinfill_client (infill_client.py, ctypes), as every Infill
plug-in is: the docker (docker.py) drives one Repaint (repaint.py) per edit; layer_io.py moves
layers and selections in and out of files at their own depth.
"""
try:
    from krita import DockWidgetFactory, DockWidgetFactoryBase, Krita
except ImportError:  # imported outside Krita (documentation tools): nothing to register
    Krita = None

if Krita is not None:
    from .docker import InfillDocker

    Krita.instance().addDockWidgetFactory(
        DockWidgetFactory("infill_docker", DockWidgetFactoryBase.DockRight, InfillDocker))
