"""Scale-out on Ray Serve: one engine replica per GPU behind the same HTTP API, routed by voice.

Only `launch.py --replicas` and Serve configs (deploy/serve.yaml) import this package; the
single-process server never imports Ray. Modules: routing (the voice-affinity request router),
replica (the engine deployment), remote_engine (the engine as the web app sees it, over a
DeploymentHandle), ingress (the HTTP deployment), application (the Serve application and its
settings), launcher (launch.py's cluster mode).
"""
