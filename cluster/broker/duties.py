"""Periodic duties of a node, five tasks: registration, producer-id blocks, retention,
restoration and expiry.

- Registration: until the metadata state lists this broker with its addresses, propose
  `RegisterBroker` (forwarded to the metadata leader by any node).
- PID blocks: keep the `PidBlockLease` stocked; ask for the next block at 90% use, or at once
  when InitProducerId found the lease empty.
- Retention: the leader of each group whose topic sets `retention_ms` or `retention_bytes`
  proposes `AdvanceLogStart` once whole sealed segments are out of retention; every replica
  then deletes its segments below that offset in apply.
- Restoration: a replica that installed a snapshot past its local log (see replica.py) fetches
  the records it missed from a peer replica, verifies each batch's CRC, and splices them in
  front of its log between two applies.
- Expiry: time enters the log only through leaders. The leader of each group this node leads
  proposes an expiry entry stamped with its clock, and only when something would expire, so an
  idle cluster writes nothing. Every replica then expires the same producers at the same index.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from cluster.broker.node import Node, PartitionHandle
from cluster.broker.peers import MissedBatch, PeerTalk
from cluster.broker.replica import MetadataReplica, TxnStateReplica
from cluster.broker.storage import StorageGapError, leader_epoch_of
from cluster.clock import wall_ms
from cluster.errors import RaftbrokerError
from cluster.raft import ProposalError, RaftGroup
from statemachine.commands import (
    AdvanceLogStart,
    AllocatePidBlock,
    ExpireProducers,
    ExpireTransactionalIds,
    RegisterBroker,
)
from statemachine.pid_allocator import PidBlock
from statemachine.records import BatchFormatError, verify_batch

log = logging.getLogger(__name__)
DUTY_INTERVAL_S = 0.5
RESTORE_BYTES = 4 << 20


class NodeDuties:
    def __init__(self, node: Node, talk: PeerTalk) -> None:
        self.node = node
        self.talk = talk
        self.registered = asyncio.Event()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._register())
            tasks.create_task(self._keep_pid_blocks())
            tasks.create_task(self._expire())
            tasks.create_task(self._retain())
            tasks.create_task(self._restore())

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
            wall_ms(), topic.retention_ms, topic.retention_bytes
        )
        if cutoff is not None and cutoff > replica.log_start_offset:
            command = AdvanceLogStart(min(cutoff, replica.high_watermark)).encode()
            with contextlib.suppress(ProposalError):
                await handle.group.propose(command, self._timeout_s)

    async def _restore(self) -> None:
        while True:
            await asyncio.sleep(DUTY_INTERVAL_S)
            for handle in list(self.node.partitions.values()):
                if handle.replica.restoring:
                    await self._backfill(handle)

    async def _backfill(self, handle: PartitionHandle) -> None:
        replica = handle.replica
        side = self.node.open_store(replica.backfill_dir)
        adopted = False
        try:
            wanted, end = replica.log_start_offset, replica.store.log_start_offset
            if side.log_start_offset > wanted or side.next_offset < wanted:
                side.reset(wanted)
            log.info("%s-%d: restoring offsets %d..%d from peers", *handle.key, wanted, end)
            while side.next_offset < end:
                if self.node.partitions.get(handle.key) is not handle:
                    return  # the partition was stopped meanwhile
                for batch in await self._fetch_missed(handle, side.next_offset):
                    if side.next_offset <= batch.base_offset < end:
                        count = verify_batch(batch.batch).record_count
                        side.append(
                            batch.base_offset,
                            count,
                            batch.append_time_ms,
                            batch.batch,
                            leader_epoch_of(batch.batch),  # the epoch its peer stored
                        )
            await handle.group.read(lambda: replica.adopt_backfill(side))
            adopted = True
            log.info("%s-%d: restored offsets %d..%d", *handle.key, wanted, end)
        except StorageGapError as exc:  # what it holds does not line up with its peers'
            log.warning("%s-%d: restoration starts over: %r", *handle.key, exc)
            side.reset(replica.log_start_offset)
        except (RaftbrokerError, BatchFormatError) as exc:  # a peer, the store, a batch
            log.warning("%s-%d: restoration interrupted: %r", *handle.key, exc)
        finally:
            if not adopted:
                side.close()

    async def _fetch_missed(self, handle: PartitionHandle, offset: int) -> list[MissedBatch]:
        """Batches from `offset` on, from the first peer replica that has them."""
        me = self.node.config.node_id
        for peer in handle.peers_by_raft_address.values():
            if peer.node_id == me:
                continue
            batches = await self.talk.batches_from(peer, *handle.key, offset, RESTORE_BYTES)
            if batches:
                return list(batches)
        await asyncio.sleep(DUTY_INTERVAL_S)  # nobody has them right now: try again shortly
        return []

    async def _expire_producers(self, handle: PartitionHandle) -> None:
        if not handle.group.serving:
            return
        expiration_ms = self.node.config.timing.producer_id_expiration_ms
        stamp = wall_ms()
        replica = handle.replica
        if await handle.group.read(lambda: replica.machine.expiry_due(stamp, expiration_ms)):
            command = ExpireProducers(stamp, expiration_ms).encode()
            with contextlib.suppress(ProposalError):
                await handle.group.propose(command, self._timeout_s)

    async def _expire_transactional_ids(self) -> None:
        """On each transaction state partition this node leads, and on the metadata group
        (whose registry holds the ids of logs written before the coordinator existed)."""
        expiration_ms = self.node.config.timing.transactional_id_expiration_ms
        holders: list[tuple[RaftGroup, MetadataReplica | TxnStateReplica]] = [
            (self.node.metadata, self.node.metadata_replica),
            *((h.group, h.replica) for h in self.node.txn_states.values()),
        ]
        for group, replica in holders:
            stamp = wall_ms()
            if not group.serving or not replica.machine.expiry_due(stamp, expiration_ms):
                continue
            command = ExpireTransactionalIds(stamp, expiration_ms).encode()
            with contextlib.suppress(ProposalError):
                await group.propose(command, self._timeout_s)
