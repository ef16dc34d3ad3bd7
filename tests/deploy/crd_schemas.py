"""Hand-written JSON schemas for the custom resources kubernetes-validate has no schema for.

They cover only the fields our manifests use (Prometheus Operator monitoring.coreos.com/v1, KServe
serving.kserve.io v1alpha1/v1beta1), closed with additionalProperties=false where a typo would otherwise go
unnoticed (a misspelt field in a custom resource is silently dropped by the API server).
"""

from __future__ import annotations

_STR = {"type": "string"}
_LABELS = {"type": "object", "additionalProperties": _STR}
_METADATA = {"type": "object", "required": ["name"],
             "properties": {"name": _STR, "namespace": _STR, "labels": _LABELS, "annotations": _LABELS}}


def _object(properties: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _resource(api_version: str, kind: str, spec: dict) -> dict:
    return _object({"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": _METADATA,
                    "spec": spec}, ["apiVersion", "kind", "metadata", "spec"])


_SELECTOR = _object({"matchLabels": _LABELS}, ["matchLabels"])
_DURATION = {"type": "string", "pattern": r"^([0-9]+(ms|s|m|h))+$"}

SERVICE_MONITOR = _resource("monitoring.coreos.com/v1", "ServiceMonitor", _object({
    "selector": _SELECTOR,
    "namespaceSelector": {"type": "object"},
    "endpoints": {"type": "array", "minItems": 1, "items": _object({
        "port": _STR, "path": _STR, "interval": _DURATION, "scrapeTimeout": _DURATION, "scheme": _STR}, ["port"])},
}, ["selector", "endpoints"]))

_RULE = {"type": "object", "additionalProperties": False, "required": ["expr"],
         "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
         "properties": {"record": {"type": "string", "pattern": "^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
                        "alert": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9_]*$"},
                        "expr": {"type": "string", "minLength": 1}, "for": _DURATION,
                        "labels": _LABELS, "annotations": _LABELS}}
PROMETHEUS_RULE = _resource("monitoring.coreos.com/v1", "PrometheusRule", _object({
    "groups": {"type": "array", "minItems": 1, "items": _object({
        "name": _STR, "interval": _DURATION, "rules": {"type": "array", "minItems": 1, "items": _RULE}},
        ["name", "rules"])},
}, ["groups"]))

_MODEL_FORMAT = _object({"name": _STR, "version": {"type": "string", "pattern": r"^\d+(\.\d+){0,2}$"},
                         "autoSelect": {"type": "boolean"}, "priority": {"type": "integer", "minimum": 1}},
                        ["name"])
CLUSTER_SERVING_RUNTIME = _resource("serving.kserve.io/v1alpha1", "ClusterServingRuntime", _object({
    "annotations": _LABELS,
    "supportedModelFormats": {"type": "array", "minItems": 1, "items": _MODEL_FORMAT},
    "protocolVersions": {"type": "array", "items": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]}},
    "multiModel": {"type": "boolean"},
    "disabled": {"type": "boolean"},
    # containers are core/v1 Containers: the test validates them with the Kubernetes Pod schema
    "containers": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["name", "image"]}},
}, ["supportedModelFormats", "containers"]))

INFERENCE_SERVICE = _resource("serving.kserve.io/v1beta1", "InferenceService", _object({
    "predictor": _object({
        "minReplicas": {"type": "integer", "minimum": 0}, "maxReplicas": {"type": "integer", "minimum": 1},
        "scaleMetric": {"enum": ["cpu", "memory", "concurrency", "rps"]}, "scaleTarget": {"type": "integer"},
        "timeout": {"type": "integer"},
        "model": _object({
            "modelFormat": _object({"name": _STR, "version": _STR}, ["name"]),
            "runtime": _STR, "protocolVersion": {"enum": ["v1", "v2", "grpc-v2"]}, "storageUri": _STR,
            "resources": {"type": "object"}}, ["modelFormat"]),
    }, ["model"]),
}, ["predictor"]))

BY_KIND = {
    "ServiceMonitor": SERVICE_MONITOR,
    "PrometheusRule": PROMETHEUS_RULE,
    "ClusterServingRuntime": CLUSTER_SERVING_RUNTIME,
    "InferenceService": INFERENCE_SERVICE,
}
