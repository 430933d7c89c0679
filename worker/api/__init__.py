"""`miro serve`: the OpenAI Batch API (files and batches) over HTTP, on the same Redis and storage as the fleet.

app.py builds the app (auth, error shapes, routers); file_store.py keeps files (bytes in storage, records in
Redis) and upload.py streams multipart uploads into it; batch_records.py and batch_shape.py map miro's batch
record onto OpenAI's Batch object; file_routes.py, batch_routes.py and fleet_routes.py are the HTTP routes;
page.html is the live page at /.
"""

from miro.worker.api.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
