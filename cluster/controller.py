"""Periodic duties of a node: registration, producer-id blocks, and expiry entries.

- Registration: until the metadata state lists this broker with its addresses, propose
  `RegisterBroker` (forwarded to the metadata leader by any node).
- PID blocks: keep the `PidBlockLease` stocked; ask for the next block at 90% use, or at once
  when InitProducerId found the lease empty.
- Retention: the leader of each group whose topic sets `retention_ms` or `retention_bytes`
  proposes `AdvanceLogStart` once whole sealed segments are out of retention; every replica
  then deletes its segments below that offset in apply.
- Expiry: time enters the log only through leaders. The leader of each group this node leads
  proposes an expiry entry stamped with its clock, and only when something would expire, so an
  idle cluster writes nothing. Every replica then expires the same producers at the same index.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from cluster.node import Node, PartitionHandle, now_ms
from cluster.raft import ProposalError
from statemachine.commands import (
    AdvanceLogStart,
    AllocatePidBlock,
    ExpireProducers,
    ExpireTransactionalIds,
    RegisterBroker,
)
from statemachine.pid_allocator import PidBlock

log = logging.getLogger(__name__)
DUTY_INTERVAL_S = 0.5


class Controller:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.registered = asyncio.Event()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._register())
            tasks.create_task(self._keep_pid_blocks())
            tasks.create_task(self._expire())
            tasks.create_task(self._retain())

    @property
    def _timeout_s(self) -> float:
        return self.node.config.timing.request_timeout_ms / 1000

    async def _register(self) -> None:
        config = self.node.config
        me = config.self_peer
        command = RegisterBroker(config.node_id, me.client_address, me.raft_address).encode()
        while True:
            brokers = await self.node.metadata.read(
                lambda: dict(self.node.metadata_replica.machine.brokers)
            )
            known = brokers.get(config.node_id)
            if known and (known.client_address, known.raft_address) == (
                me.client_address,
                me.raft_address,
            ):
                self.registered.set()
            else:
                with contextlib.suppress(ProposalError):
                    await self.node.metadata.propose(command, self._timeout_s, forward=True)
            await asyncio.sleep(DUTY_INTERVAL_S)

    async def _keep_pid_blocks(self) -> None:
        node = self.node
        while True:
            await self.registered.wait()
            if node.lease.wants_block():
                await self._request_block()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(node.pid_block_wanted.wait(), DUTY_INTERVAL_S)
            node.pid_block_wanted.clear()

    async def _request_block(self) -> None:
        node = self.node
        command = AllocatePidBlock(node.config.node_id, node.config.timing.pid_block_size)
        try:
            result = await node.metadata.propose(command.encode(), self._timeout_s, forward=True)
        except ProposalError as exc:
            log.info("producer-id block request failed: %s", exc.error.name)
            result = None
        if isinstance(result, PidBlock):
            node.lease.add_block(result)
        else:
            node.lease.request_failed()

    async def _expire(self) -> None:
        interval_s = self.node.config.timing.expiry_tick_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            await self._expire_transactional_ids()
            for handle in list(self.node.partitions.values()):
                await self._expire_producers(handle)

    async def _retain(self) -> None:
        interval_s = self.node.config.timing.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            for handle in list(self.node.partitions.values()):
                await self._retain_partition(handle)

    async def _retain_partition(self, handle: PartitionHandle) -> None:
        topic = handle.topic
        if not handle.group.serving or (topic.retention_ms < 0 and topic.retention_bytes < 0):
            return
        replica = handle.replica
        cutoff = replica.store.segments_for_retention(
            now_ms(), topic.retention_ms, topic.retention_bytes
        )
        if cutoff is not None and cutoff > replica.log_start_offset:
            command = AdvanceLogStart(min(cutoff, replica.high_watermark)).encode()
            with contextlib.suppress(ProposalError):
                await handle.group.propose(command, self._timeout_s)

    async def _expire_producers(self, handle: PartitionHandle) -> None:
        if not handle.group.serving:
            return
        expiration_ms = self.node.config.timing.producer_id_expiration_ms
        stamp = now_ms()
        replica = handle.replica
        if await handle.group.read(lambda: replica.machine.expiry_due(stamp, expiration_ms)):
            command = ExpireProducers(stamp, expiration_ms).encode()
            with contextlib.suppress(ProposalError):
                await handle.group.propose(command, self._timeout_s)

    async def _expire_transactional_ids(self) -> None:
        group = self.node.metadata
        if not group.serving:
            return
        expiration_ms = self.node.config.timing.transactional_id_expiration_ms
        stamp = now_ms()
        replica = self.node.metadata_replica
        if await group.read(lambda: replica.machine.expiry_due(stamp, expiration_ms)):
            command = ExpireTransactionalIds(stamp, expiration_ms).encode()
            with contextlib.suppress(ProposalError):
                await group.propose(command, self._timeout_s)
