"""Talking to the kubelet's side of the device-plugin API: registration, and noticing a kubelet restart.

A plugin registers by calling `v1beta1.Registration/Register` on `<device-plugin dir>/kubelet.sock` with
its socket's file name and resource; the kubelet then connects back to that socket. When the kubelet
restarts it removes every socket in the directory and creates `kubelet.sock` anew, and forgets every plugin:
each must listen again and register again. `KubeletSocket.identity` (the socket file's inode and change
time) lets the daemon see that happen by polling one `stat`, without watching the directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc

from hami.errors import HamiError
from hami.node.proto import deviceplugin_pb2 as pb
from hami.node.proto import deviceplugin_pb2_grpc as pb_grpc

__all__ = ["API_VERSION", "KUBELET_SOCKET", "KubeletSocket", "RegistrationError"]

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"


class RegistrationError(HamiError):
    """The kubelet refused the registration or could not be reached."""


class KubeletSocket:
    """The kubelet's registration socket in one device-plugin directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / KUBELET_SOCKET

    def identity(self) -> tuple[int, int] | None:
        """(inode, change time) of `kubelet.sock`, None while it does not exist; a new value means a new kubelet."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_ctime_ns)

    async def register(
        self, endpoint: str, resource: str, options: pb.DevicePluginOptions, timeout: float = 5.0
    ) -> None:
        """Register the plugin listening on `<directory>/<endpoint>` for `resource`.

        :raises RegistrationError: with the kubelet's answer, or why it could not be reached.
        """
        request = pb.RegisterRequest(version=API_VERSION, endpoint=endpoint, resource_name=resource, options=options)
        try:
            async with grpc.aio.insecure_channel(f"unix://{self.path}") as channel:
                await pb_grpc.RegistrationStub(channel).Register(request, timeout=timeout, wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            raise RegistrationError(
                f"registering {resource} with the kubelet at {self.path} failed: {exc.code().name}: {exc.details()}"
            ) from None
