"""Session and device settings as written: ``ConfigProto``/``GPUOptions`` keywords and
``config.gpu_options.x = ...`` assignments (memory growth, soft placement, visible devices)."""

from __future__ import annotations

import libcst as cst

from tfmigrate.convert import ir
from tfmigrate.convert.recognize._code import Code, body_nodes, call_name

_CONFIGS = frozenset({"tensorflow.ConfigProto", "tensorflow.GPUOptions"})
_SETTINGS = ("gpu_options", "allow_soft_placement", "log_device_placement", "device_count")


def find_device_config(region: list[Code]) -> ir.DeviceConfig | None:
    settings: list[str] = []
    where: ir.Where | None = None
    for code in region:
        source = code.source
        for node in body_nodes(code):
            if isinstance(node, cst.Call) and call_name(source, node) in _CONFIGS:
                where = where or source.where(node)
                for arg in node.args:
                    if arg.keyword is not None:
                        settings.append(f"{arg.keyword.value}={source.src(arg.value, 40)}")
            elif (
                isinstance(node, cst.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0].target, cst.Attribute)
            ):
                target = source.src(node.targets[0].target, 60)
                if any(s in target for s in _SETTINGS):
                    where = where or source.where(node)
                    settings.append(f"{target.split('.', 1)[-1]}={source.src(node.value, 40)}")
    if not settings and where is None:
        return None
    return ir.DeviceConfig(tuple(dict.fromkeys(settings)), where)
