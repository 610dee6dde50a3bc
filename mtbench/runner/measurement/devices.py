"""Whether a backend's framework is installed and starts here, and on which devices: asked through the backend
plugin, which imports its framework (never keras)."""


def describe_backend(backend):
    try:
        reason = backend.missing_framework()
        if reason:
            return {"available": False, "reason": reason}
        return {"available": True, "versions": backend.framework_versions(), "device": backend.device_info()}
    except Exception as error:  # a framework that is installed but fails to start is a fact to show
        return {"available": False, "reason": f"{type(error).__name__}: {error}"}
