from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "num_speculative_tokens", "ignore_eos")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    num_speculative_tokens: int
    ignore_eos: bool
    def __init__(self, prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., num_speculative_tokens: _Optional[int] = ..., ignore_eos: _Optional[bool] = ...) -> None: ...

class GenerationStats(_message.Message):
    __slots__ = ("proposed", "accepted", "acceptance_rate", "rounds", "tokens_per_second", "time_to_first_token_ms", "mean_acceptance_length", "prompt_tokens", "generated_tokens", "draft_ms", "target_ms", "total_ms", "transport_ms", "rejections", "proposed_at_position", "accepted_at_position", "draft_hidden_ms", "proposed_by_source", "accepted_by_source", "draft_pass_ms", "target_pass_ms")
    class ProposedBySourceEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class AcceptedBySourceEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PROPOSED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_RATE_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    MEAN_ACCEPTANCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MS_FIELD_NUMBER: _ClassVar[int]
    TARGET_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_MS_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_AT_POSITION_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_AT_POSITION_FIELD_NUMBER: _ClassVar[int]
    DRAFT_HIDDEN_MS_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_BY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_BY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PASS_MS_FIELD_NUMBER: _ClassVar[int]
    TARGET_PASS_MS_FIELD_NUMBER: _ClassVar[int]
    proposed: int
    accepted: int
    acceptance_rate: float
    rounds: int
    tokens_per_second: float
    time_to_first_token_ms: float
    mean_acceptance_length: float
    prompt_tokens: int
    generated_tokens: int
    draft_ms: float
    target_ms: float
    total_ms: float
    transport_ms: float
    rejections: int
    proposed_at_position: _containers.RepeatedScalarFieldContainer[int]
    accepted_at_position: _containers.RepeatedScalarFieldContainer[int]
    draft_hidden_ms: float
    proposed_by_source: _containers.ScalarMap[str, int]
    accepted_by_source: _containers.ScalarMap[str, int]
    draft_pass_ms: float
    target_pass_ms: float
    def __init__(self, proposed: _Optional[int] = ..., accepted: _Optional[int] = ..., acceptance_rate: _Optional[float] = ..., rounds: _Optional[int] = ..., tokens_per_second: _Optional[float] = ..., time_to_first_token_ms: _Optional[float] = ..., mean_acceptance_length: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., draft_ms: _Optional[float] = ..., target_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., transport_ms: _Optional[float] = ..., rejections: _Optional[int] = ..., proposed_at_position: _Optional[_Iterable[int]] = ..., accepted_at_position: _Optional[_Iterable[int]] = ..., draft_hidden_ms: _Optional[float] = ..., proposed_by_source: _Optional[_Mapping[str, int]] = ..., accepted_by_source: _Optional[_Mapping[str, int]] = ..., draft_pass_ms: _Optional[float] = ..., target_pass_ms: _Optional[float] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "stats")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    stats: GenerationStats
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., stats: _Optional[_Union[GenerationStats, _Mapping]] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "stats")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    stats: GenerationStats
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., stats: _Optional[_Union[GenerationStats, _Mapping]] = ...) -> None: ...

class ServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerInfoResponse(_message.Message):
    __slots__ = ("version", "target_model", "draft_model", "tokenizer_fingerprint", "default_num_speculative_tokens", "max_num_speculative_tokens", "max_context", "adaptive", "max_adaptive_num_speculative_tokens")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODEL_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVE_FIELD_NUMBER: _ClassVar[int]
    MAX_ADAPTIVE_NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    version: str
    target_model: str
    draft_model: str
    tokenizer_fingerprint: str
    default_num_speculative_tokens: int
    max_num_speculative_tokens: int
    max_context: int
    adaptive: bool
    max_adaptive_num_speculative_tokens: int
    def __init__(self, version: _Optional[str] = ..., target_model: _Optional[str] = ..., draft_model: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ..., default_num_speculative_tokens: _Optional[int] = ..., max_num_speculative_tokens: _Optional[int] = ..., max_context: _Optional[int] = ..., adaptive: _Optional[bool] = ..., max_adaptive_num_speculative_tokens: _Optional[int] = ...) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("role", "address", "state", "active_sessions", "detail")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    role: str
    address: str
    state: str
    active_sessions: int
    detail: str
    def __init__(self, role: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[str] = ..., active_sessions: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class ReplicaSet(_message.Message):
    __slots__ = ("replicas", "desired_draft_replicas", "desired_target_replicas")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DESIRED_DRAFT_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DESIRED_TARGET_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    desired_draft_replicas: int
    desired_target_replicas: int
    def __init__(self, replicas: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ..., desired_draft_replicas: _Optional[int] = ..., desired_target_replicas: _Optional[int] = ...) -> None: ...

class ListReplicasRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListReplicasResponse(_message.Message):
    __slots__ = ("replica_set",)
    REPLICA_SET_FIELD_NUMBER: _ClassVar[int]
    replica_set: ReplicaSet
    def __init__(self, replica_set: _Optional[_Union[ReplicaSet, _Mapping]] = ...) -> None: ...

class ScaleRequest(_message.Message):
    __slots__ = ("draft_replicas", "target_replicas")
    DRAFT_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TARGET_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    draft_replicas: int
    target_replicas: int
    def __init__(self, draft_replicas: _Optional[int] = ..., target_replicas: _Optional[int] = ...) -> None: ...

class ScaleResponse(_message.Message):
    __slots__ = ("replica_set",)
    REPLICA_SET_FIELD_NUMBER: _ClassVar[int]
    replica_set: ReplicaSet
    def __init__(self, replica_set: _Optional[_Union[ReplicaSet, _Mapping]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ...) -> None: ...

class SparseProbs(_message.Message):
    __slots__ = ("row_lengths", "token_ids", "probs")
    ROW_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    row_lengths: _containers.RepeatedScalarFieldContainer[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, row_lengths: _Optional[_Iterable[int]] = ..., token_ids: _Optional[_Iterable[int]] = ..., probs: _Optional[_Iterable[float]] = ...) -> None: ...

class ModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfoResponse(_message.Message):
    __slots__ = ("model", "tokenizer_fingerprint", "vocab_size", "max_context", "eos_token_ids", "num_sessions", "placement", "token_agnostic", "padded_vocab_size")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_AGNOSTIC_FIELD_NUMBER: _ClassVar[int]
    PADDED_VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    model: str
    tokenizer_fingerprint: str
    vocab_size: int
    max_context: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_sessions: int
    placement: Placement
    token_agnostic: bool
    padded_vocab_size: int
    def __init__(self, model: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_context: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., num_sessions: _Optional[int] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ..., token_agnostic: _Optional[bool] = ..., padded_vocab_size: _Optional[int] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("host", "device", "cpus")
    HOST_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    host: str
    device: str
    cpus: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, host: _Optional[str] = ..., device: _Optional[str] = ..., cpus: _Optional[_Iterable[int]] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("session_id", "prompt_token_ids", "seed", "first_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    seed: int
    first_token: SamplingParams
    def __init__(self, session_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., seed: _Optional[int] = ..., first_token: _Optional[_Union[SamplingParams, _Mapping]] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("first_token_id",)
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    first_token_id: int
    def __init__(self, first_token_id: _Optional[int] = ...) -> None: ...

class ProposeRequest(_message.Message):
    __slots__ = ("session_id", "num_kept", "new_token_ids", "k", "sampling", "confidence_threshold", "target_idle")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_KEPT_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    TARGET_IDLE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    num_kept: int
    new_token_ids: _containers.RepeatedScalarFieldContainer[int]
    k: int
    sampling: SamplingParams
    confidence_threshold: float
    target_idle: bool
    def __init__(self, session_id: _Optional[str] = ..., num_kept: _Optional[int] = ..., new_token_ids: _Optional[_Iterable[int]] = ..., k: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., confidence_threshold: _Optional[float] = ..., target_idle: _Optional[bool] = ...) -> None: ...

class ProposeResponse(_message.Message):
    __slots__ = ("token_ids", "probs", "compute_ms", "batch_size", "source", "pass_ms")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PASS_MS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    probs: SparseProbs
    compute_ms: float
    batch_size: int
    source: str
    pass_ms: float
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., probs: _Optional[_Union[SparseProbs, _Mapping]] = ..., compute_ms: _Optional[float] = ..., batch_size: _Optional[int] = ..., source: _Optional[str] = ..., pass_ms: _Optional[float] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("session_id", "draft_token_ids", "draft_probs", "sampling", "num_tokens", "stop_token_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PROBS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    draft_token_ids: _containers.RepeatedScalarFieldContainer[int]
    draft_probs: SparseProbs
    sampling: SamplingParams
    num_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., draft_token_ids: _Optional[_Iterable[int]] = ..., draft_probs: _Optional[_Union[SparseProbs, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., num_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("token_ids", "num_accepted", "compute_ms", "batch_size", "batch_tokens", "pass_ms")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PASS_MS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_accepted: int
    compute_ms: float
    batch_size: int
    batch_tokens: int
    pass_ms: float
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., num_accepted: _Optional[int] = ..., compute_ms: _Optional[float] = ..., batch_size: _Optional[int] = ..., batch_tokens: _Optional[int] = ..., pass_ms: _Optional[float] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RoundError(_message.Message):
    __slots__ = ("code", "details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: int
    details: str
    def __init__(self, code: _Optional[int] = ..., details: _Optional[str] = ...) -> None: ...

class ProposeBatch(_message.Message):
    __slots__ = ("calls", "cancelled_call_ids")
    class Call(_message.Message):
        __slots__ = ("call_id", "request", "request_id")
        CALL_ID_FIELD_NUMBER: _ClassVar[int]
        REQUEST_FIELD_NUMBER: _ClassVar[int]
        REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
        call_id: int
        request: ProposeRequest
        request_id: str
        def __init__(self, call_id: _Optional[int] = ..., request: _Optional[_Union[ProposeRequest, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...
    CALLS_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_CALL_IDS_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[ProposeBatch.Call]
    cancelled_call_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, calls: _Optional[_Iterable[_Union[ProposeBatch.Call, _Mapping]]] = ..., cancelled_call_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ProposeResults(_message.Message):
    __slots__ = ("results",)
    class Result(_message.Message):
        __slots__ = ("call_id", "response", "error")
        CALL_ID_FIELD_NUMBER: _ClassVar[int]
        RESPONSE_FIELD_NUMBER: _ClassVar[int]
        ERROR_FIELD_NUMBER: _ClassVar[int]
        call_id: int
        response: ProposeResponse
        error: RoundError
        def __init__(self, call_id: _Optional[int] = ..., response: _Optional[_Union[ProposeResponse, _Mapping]] = ..., error: _Optional[_Union[RoundError, _Mapping]] = ...) -> None: ...
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ProposeResults.Result]
    def __init__(self, results: _Optional[_Iterable[_Union[ProposeResults.Result, _Mapping]]] = ...) -> None: ...

class VerifyBatch(_message.Message):
    __slots__ = ("calls", "cancelled_call_ids")
    class Call(_message.Message):
        __slots__ = ("call_id", "request", "request_id")
        CALL_ID_FIELD_NUMBER: _ClassVar[int]
        REQUEST_FIELD_NUMBER: _ClassVar[int]
        REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
        call_id: int
        request: VerifyRequest
        request_id: str
        def __init__(self, call_id: _Optional[int] = ..., request: _Optional[_Union[VerifyRequest, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...
    CALLS_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_CALL_IDS_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[VerifyBatch.Call]
    cancelled_call_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, calls: _Optional[_Iterable[_Union[VerifyBatch.Call, _Mapping]]] = ..., cancelled_call_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class VerifyResults(_message.Message):
    __slots__ = ("results",)
    class Result(_message.Message):
        __slots__ = ("call_id", "response", "error", "partial")
        CALL_ID_FIELD_NUMBER: _ClassVar[int]
        RESPONSE_FIELD_NUMBER: _ClassVar[int]
        ERROR_FIELD_NUMBER: _ClassVar[int]
        PARTIAL_FIELD_NUMBER: _ClassVar[int]
        call_id: int
        response: VerifyResponse
        error: RoundError
        partial: bool
        def __init__(self, call_id: _Optional[int] = ..., response: _Optional[_Union[VerifyResponse, _Mapping]] = ..., error: _Optional[_Union[RoundError, _Mapping]] = ..., partial: _Optional[bool] = ...) -> None: ...
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[VerifyResults.Result]
    def __init__(self, results: _Optional[_Iterable[_Union[VerifyResults.Result, _Mapping]]] = ...) -> None: ...
