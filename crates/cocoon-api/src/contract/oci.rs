//! OCI annotation keys, artifact types and media types of `contract.md` §9 and `registry.md`
//! §5–§7, byte-for-byte, shared by the registry client, the pusher/puller and the operator.

// ---- manifest and layer annotation keys ----

/// Manifest annotation: the pod image ref recorded at push time (only when non-empty).
pub const ANNOTATION_BASE_IMAGE: &str = "cocoonstack.snapshot.baseimage";
/// Manifest annotation: push time, RFC3339 UTC.
pub const ANNOTATION_CREATED: &str = "org.opencontainers.image.created";
/// Manifest annotation (optional): build provenance source.
pub const ANNOTATION_SOURCE: &str = "org.opencontainers.image.source";
/// Manifest annotation (optional): build provenance revision.
pub const ANNOTATION_REVISION: &str = "org.opencontainers.image.revision";
/// Layer annotation: the file name inside the snapshot directory.
pub const ANNOTATION_TITLE: &str = "org.opencontainers.image.title";
/// Manifest annotation (beyond): the node that pushed, for peer restore.
pub const ANNOTATION_FROM_NODE: &str = "cocoonstack.snapshot.from-node";
/// Manifest annotation (beyond; tenant isolation): the namespace of the pod whose VM this
/// snapshot artifact holds. Written on every snapshot this project pushes (`:hibernate`,
/// `:latest`); a pull for a restore or wake accepts an artifact carrying it only for that
/// namespace.
pub const ANNOTATION_OWNER_NAMESPACE: &str = "cocoonstack.snapshot.owner-namespace";
/// Manifest annotation (beyond; tenant isolation): the name of the pod whose VM this snapshot
/// artifact holds (with [`ANNOTATION_OWNER_NAMESPACE`]).
pub const ANNOTATION_OWNER_POD: &str = "cocoonstack.snapshot.owner-pod";
/// Manifest annotation (beyond; tenant isolation, additive): the UID of the owner's namespace
/// at push time (with [`ANNOTATION_OWNER_NAMESPACE`]), written when the pushing agent could
/// read it. A namespace deleted and re-created under the same name has another UID, so it
/// never inherits the old one's snapshots. Artifacts without it (older pushes, the Go
/// components) are still read; see [`super::owner`].
pub const ANNOTATION_OWNER_NAMESPACE_UID: &str = "cocoonstack.snapshot.owner-namespace-uid";
/// Layer annotation (beyond): index of a chunk in a v2 chunked file.
pub const ANNOTATION_CHUNK_INDEX: &str = "cocoonstack.chunk.index";
/// Layer annotation (beyond): number of chunks of a v2 chunked file.
pub const ANNOTATION_CHUNK_COUNT: &str = "cocoonstack.chunk.count";

// ---- cocoonstack artifact and config types ----

/// artifactType of a snapshot artifact (v1).
pub const ARTIFACT_SNAPSHOT_V1: &str = "application/vnd.cocoonstack.snapshot.v1+json";
/// artifactType of a chunked/zstd snapshot artifact (beyond: v2).
pub const ARTIFACT_SNAPSHOT_V2: &str = "application/vnd.cocoonstack.snapshot.v2+json";
/// Media type of the snapshot config blob.
pub const MEDIA_SNAPSHOT_CONFIG_V1: &str = "application/vnd.cocoonstack.snapshot.config.v1+json";
/// artifactType of a cloud (OS disk) image.
pub const ARTIFACT_OS_IMAGE_V1: &str = "application/vnd.cocoonstack.os-image.v1+json";
/// artifactType of a legacy cloud image, still recognised.
pub const ARTIFACT_WINDOWS_IMAGE_V1: &str = "application/vnd.cocoonstack.windows-image.v1+json";

// ---- snapshot layer media types (registry.md §5.4) ----

/// Layer `config.json`.
pub const MEDIA_VM_CONFIG: &str = "application/vnd.cocoonstack.vm.config+json";
/// Layer `state.json`.
pub const MEDIA_VM_STATE: &str = "application/vnd.cocoonstack.vm.state+json";
/// Layer `memory-ranges`.
pub const MEDIA_VM_MEMORY: &str = "application/vnd.cocoonstack.vm.memory";
/// Layer `cidata.img`.
pub const MEDIA_VM_CIDATA: &str = "application/vnd.cocoonstack.vm.cidata";
/// Layer `*.qcow2` (also a cloud-image disk layer).
pub const MEDIA_DISK_QCOW2: &str = "application/vnd.cocoonstack.disk.qcow2";
/// Cloud-image qcow2 disk part.
pub const MEDIA_DISK_QCOW2_PART: &str = "application/vnd.cocoonstack.disk.qcow2.part";
/// Layer `*.raw` (also a cloud-image disk layer).
pub const MEDIA_DISK_RAW: &str = "application/vnd.cocoonstack.disk.raw";
/// Cloud-image raw disk part.
pub const MEDIA_DISK_RAW_PART: &str = "application/vnd.cocoonstack.disk.raw.part";
/// Legacy Windows cloud-image qcow2 disk (chosen: the `windows.disk` infix, as the Go projects spell it).
pub const MEDIA_WINDOWS_DISK_QCOW2: &str = "application/vnd.cocoonstack.windows.disk.qcow2";
/// Legacy Windows cloud-image qcow2 disk part.
pub const MEDIA_WINDOWS_DISK_QCOW2_PART: &str =
    "application/vnd.cocoonstack.windows.disk.qcow2.part";
/// Legacy Windows cloud-image raw disk.
pub const MEDIA_WINDOWS_DISK_RAW: &str = "application/vnd.cocoonstack.windows.disk.raw";
/// Legacy Windows cloud-image raw disk part.
pub const MEDIA_WINDOWS_DISK_RAW_PART: &str = "application/vnd.cocoonstack.windows.disk.raw.part";
/// Any other snapshot file.
pub const MEDIA_OCTET_STREAM: &str = "application/octet-stream";
/// Suffix appended to a layer media type when the layer is zstd-compressed (beyond: v2).
pub const ZSTD_SUFFIX: &str = "+zstd";

/// Every disk layer media type of a cloud image (registry.md §7).
pub const DISK_LAYER_MEDIA_TYPES: [&str; 8] = [
    MEDIA_DISK_QCOW2,
    MEDIA_DISK_QCOW2_PART,
    MEDIA_DISK_RAW,
    MEDIA_DISK_RAW_PART,
    MEDIA_WINDOWS_DISK_QCOW2,
    MEDIA_WINDOWS_DISK_QCOW2_PART,
    MEDIA_WINDOWS_DISK_RAW,
    MEDIA_WINDOWS_DISK_RAW_PART,
];

// ---- standard OCI / Docker media types ----

/// OCI image manifest; also the content type of every cocoon manifest PUT.
pub const MEDIA_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index.
pub const MEDIA_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Docker schema 2 manifest.
pub const MEDIA_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker manifest list (index).
pub const MEDIA_DOCKER_MANIFEST_LIST: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
/// OCI container image config (classifies a manifest as a container image).
pub const MEDIA_OCI_IMAGE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// Docker container image config (classifies a manifest as a container image).
pub const MEDIA_DOCKER_IMAGE_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
/// The withdrawn OCI artifact manifest; never used, and rejected by the test registry.
pub const MEDIA_OCI_ARTIFACT_MANIFEST: &str = "application/vnd.oci.artifact.manifest.v1+json";

/// `Accept` header of every manifest GET/HEAD (registry.md §2).
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.v2+json, \
application/vnd.docker.distribution.manifest.list.v2+json";

/// Layer media type for a snapshot file, chosen by file name (registry.md §5.4).
pub fn layer_media_type(file_name: &str) -> &'static str {
    match file_name {
        "config.json" => MEDIA_VM_CONFIG,
        "state.json" => MEDIA_VM_STATE,
        "memory-ranges" => MEDIA_VM_MEMORY,
        "cidata.img" => MEDIA_VM_CIDATA,
        f if f.ends_with(".qcow2") => MEDIA_DISK_QCOW2,
        f if f.ends_with(".raw") => MEDIA_DISK_RAW,
        _ => MEDIA_OCTET_STREAM,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_media_types_by_file_name() {
        for (file, want) in [
            ("config.json", MEDIA_VM_CONFIG),
            ("state.json", MEDIA_VM_STATE),
            ("memory-ranges", MEDIA_VM_MEMORY),
            ("cidata.img", MEDIA_VM_CIDATA),
            ("overlay.qcow2", MEDIA_DISK_QCOW2),
            ("data.qcow2", MEDIA_DISK_QCOW2),
            ("cow.raw", MEDIA_DISK_RAW),
            ("snapshot.json", MEDIA_OCTET_STREAM),
            ("other", MEDIA_OCTET_STREAM),
        ] {
            assert_eq!(layer_media_type(file), want, "{file}");
        }
    }

    #[test]
    fn accept_header_lists_the_four_manifest_types() {
        let parts: Vec<&str> = MANIFEST_ACCEPT.split(", ").collect();
        assert_eq!(
            parts,
            [
                MEDIA_OCI_MANIFEST,
                MEDIA_OCI_INDEX,
                MEDIA_DOCKER_MANIFEST,
                MEDIA_DOCKER_MANIFEST_LIST
            ]
        );
    }
}
