"""Azure Functions blueprints, one module per trigger. Each is thin: trigger in, one call into upwell."""
